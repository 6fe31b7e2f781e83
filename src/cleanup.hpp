// Deleting keys: what a round of the cleanup worker and a call of idempotency_cleanup() run,
// always in a background worker process (cleanup_worker.cpp, cleanup_call.cpp), never in a
// session's transaction.
//
// Every batch is its own transaction, committed before the next starts, working as the
// extension owner (caller::ActingAsOwner), bounded by a deadline (worker_session.hpp). Two
// kinds of batch, expired keys first in every run (nothing that happens to roles delays them),
// then the pass over keys of dropped roles with the time left:
//   - keys that no role owns (a dropped or renamed role's: the owner's name names no role, or
//     the row's stamp, key_row.hpp, names an OID of this cluster that is not the role of that
//     name), walked along the heap in ranges of blocks (a TID range scan): a pass over a big
//     table reads each page once, with one join against pg_authid per range, and stamps the
//     rows from another cluster or from 1.2 with the OID of the role of their name. A pass runs
//     only when the role generation (cleanup_shared.hpp: a role dropped or renamed) moved since
//     this database's last complete pass, so a round with no role dropped costs nothing for them
//     however many roles own keys; without shared memory (or while no launcher runs) every run
//     makes the pass. A pass that a round's time ends goes on in the next round, and one that a
//     later change overtakes goes on too and comes round to where it stood (never from block 0).
//   - expired keys: up to batch_size rows with from <= expires_at <= now, in index order,
//     locked FOR UPDATE SKIP LOCKED (a claim holding a row is never blocked, and never loses
//     its row) and deleted; the next batch starts from the largest expires_at deleted, so a run
//     over a million expired keys reads each index entry about once instead of rescanning the
//     dead entries that earlier batches left at the start of the index. Under a BRIN (16+)
//     the batches go in block order instead, each from the block where the last one stopped
//     (cleanup_statements.hpp, Cursor): each block read about once per run too.
// Rows skipped because they were locked are left for the next run: a claim that holds such a
// row is renewing it. Both the worker's rounds and idempotency_cleanup() are paced by the
// throttle (cleanup_throttle.hpp): at full speed where nobody else works, in short batches
// with pauses while other sessions do.
#pragma once

#include "pg.hpp"

namespace idem::cleanup {

// What to run.
struct Request {
  int batch_size = 0;
  TimestampTz now = 0;       // keys with expires_at <= now are expired
  int64 time_budget_us = 0;  // stop after about this long (a worker's round); 0: none
  bool obey_pause = false;   // stop where idempotency.cleanup_worker is off (the worker)
  bool resume = false;       // go on where the last unfinished round stopped
  Oid table = InvalidOid;    // the key table the requester saw; InvalidOid: whichever
  pid_t requester = 0;       // stop when this backend is gone; 0: nobody waits
};

// What was done; filled in as it goes, so that a failure still tells.
struct Progress {
  bool installed = false;   // the extension is installed (false: nothing was done)
  bool paused = false;      // idempotency.cleanup_worker is off for this database
  bool unfinished = false;  // stopped early (time, stop request): keys may be left
  uint64 deleted = 0;
  TimestampTz resume_from = DT_NOBEGIN;  // where an unfinished run's successor starts
  BlockNumber resume_block = 0;          // ... under a BRIN (cleanup_statements.hpp, Cursor)
  bool orphan_pass = false;              // batches of the pass over keys of dropped roles ran
  Size peak_memory = 0;                  // the most memory the process had allocated during a batch
  int pauses = 0;                        // pauses of the throttle (cleanup_throttle.hpp)
  int64 paused_ms = 0;                   // and their total length
};

// Runs `request` in the current database. Needs a background worker connected to it with no
// transaction open. Throws on failure; the caller then aborts the failed batch's transaction
// (abort_failed_batch()).
void run(const Request& request, Progress& progress);

// After run() threw: leaves the failed transaction, its SPI connection and its snapshot.
void abort_failed_batch() noexcept;

}  // namespace idem::cleanup
