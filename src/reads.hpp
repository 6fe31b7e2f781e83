// The reads of idempotency_keys, named by the snapshot they read with. Each value is
// documented once, in src/README.md ("Reads"); every read of the key table takes one.
#pragma once

namespace idem {

enum class Read {
  kDirty,      // SnapshotDirty: committed versions and those of transactions still open
  kStatement,  // the calling statement's snapshot (the active one)
  kLatest,     // a new snapshot at READ COMMITTED, the transaction's own at the snapshot levels
  kNow,        // the latest snapshot at every level, with this transaction's writes so far
  kSelf,       // SnapshotSelf: this transaction's newest version of one row, by its address
};

}  // namespace idem
