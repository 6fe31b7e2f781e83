// Transactions, as C++ asks about them. Every wrapper catches (pg_call).
#pragma once

#include "../pg_boundary.hpp"

namespace idem::pg::transactions {

// Is `xid` another transaction that is still open (not this one, nor a subtransaction of
// it)? Reads the proc array and, for an old xid, pg_subtrans. Raises (an I/O error on
// pg_subtrans). Allocates nothing.
inline bool open_other(TransactionId xid) {
  return pg_call([&] {
    return TransactionIdIsNormal(xid) && !TransactionIdIsCurrentTransactionId(xid) &&
           TransactionIdIsInProgress(xid);
  });
}

// Starts a transaction of its own (a background worker's), its statement start time now.
// Raises (out of memory). Allocates its state in TopTransactionContext.
inline void start() {
  pg_call([] {
    SetCurrentStatementStartTimestamp();
    StartTransactionCommand();
  });
}
// Commits the transaction start() began. Raises (a commit-time check, an I/O error), the
// transaction then left to abort(). Frees its memory.
inline void commit() {
  pg_call([] { CommitTransactionCommand(); });
}
// Aborts the current transaction, a failed one too, releasing what it held (locks, snapshots,
// an SPI connection). Raises only on a broken transaction state. Frees its memory.
inline void abort() {
  pg_call([] { AbortCurrentTransaction(); });
}
// Is there a backend of pid `pid`? Reads the proc array. Raises not (pg_call for a lock
// failure). Allocates nothing.
inline bool backend_exists(pid_t pid) {
  return pg_call([&] { return BackendPidGetProc(pid) != nullptr; });
}
// Refuses a command that writes, named `command` in the error, where a DELETE of the caller's
// would be refused: 25006 in a read-only transaction or during recovery. Allocates nothing.
inline void refuse_if_read_only(const char* command) {
  pg_call([&] {
    PreventCommandIfReadOnly(command);
    PreventCommandDuringRecovery(command);
  });
}
// How many backends of this database hold a snapshot, not counting this one, autovacuum's
// workers and vacuums (maintenance that paces itself), nor the backend of pid `requester` (0:
// none). Raises (out of memory). Allocates nothing that outlives the call.
inline int other_snapshots(pid_t requester) {
  return pg_call([&] {
    int count = 0;
    VirtualTransactionId* snapshots = GetCurrentVirtualXIDs(
        InvalidTransactionId, true, false, PROC_IS_AUTOVACUUM | PROC_IN_VACUUM, &count);
    pfree(snapshots);
    if (count > 0 && requester != 0) {
      const PGPROC* proc = BackendPidGetProc(requester);
      if (proc != nullptr && TransactionIdIsValid(proc->xmin)) --count;
    }
    return count;
  });
}

}  // namespace idem::pg::transactions
