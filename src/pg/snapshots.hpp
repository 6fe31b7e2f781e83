// Snapshots, as C++ pushes and pops them. Every wrapper catches (pg_call).
#pragma once

#include "../pg_boundary.hpp"

namespace idem::pg::snapshots {

// Makes a copy of the latest snapshot the active one (with the current command id, so this
// transaction's writes of earlier commands are seen). Raises (out of memory). Allocates the
// copy in TopTransactionContext; pop_active() frees it, transaction abort otherwise.
inline void push_latest() {
  pg_call([] { PushCopiedSnapshot(GetLatestSnapshot()); });
}
// Makes the transaction snapshot (taken now at the first call of a transaction) the active
// one. Raises (out of memory, 40001 for a serializable transaction that cannot get one).
// Allocates the snapshot in TopTransactionContext; pop_active() or the transaction's end
// frees it.
inline void push_transaction() {
  pg_call([] { PushActiveSnapshot(GetTransactionSnapshot()); });
}
// Pops the active snapshot. Raises only on a broken stack.
inline void pop_active() {
  pg_call([] { PopActiveSnapshot(); });
}

}  // namespace idem::pg::snapshots
