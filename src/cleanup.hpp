// Deleting expired keys: the batch statement shared by idempotency_cleanup() and the
// background worker (cleanup_worker.cpp).
//
// Both run as the extension owner (caller::ActingAsOwner). One batch is one statement: it locks up
// to batch_size rows with expires_at <= now in index order, skipping rows another transaction has
// locked (a claim renewing the key, the holder finishing), deletes exactly those, and reports how
// many it deleted and the largest expires_at among them. The next batch starts from that
// expires_at, so a run over a million expired keys reads each index entry about once instead of
// rescanning the dead entries that earlier batches left at the start of the index. Rows skipped
// because they were locked are left for the next run: a claim that holds such a row is renewing it.
#pragma once

#include "pg.hpp"

namespace idem::cleanup {

struct Batch {
  uint64 deleted = 0;
  bool full = false;                     // a relation gave batch_size rows: more may be left
  TimestampTz last_expiry = DT_NOBEGIN;  // largest expires_at deleted; the next lower bound
};

// Deletes one batch from `table` (rows with from <= expires_at <= now). Needs an open SPI
// connection; the statement is prepared once per backend and table. "now" comes from the
// caller (computed in C++: no volatile function in the DML).
Batch delete_batch(Oid table, TimestampTz now, TimestampTz from, int batch_size);

// Deletes up to `batch_size` keys whose owner names no existing role (a dropped or renamed
// role's keys are never left for a role created later under that name). Needs an open SPI
// connection.
Batch delete_orphans(Oid table, int batch_size);

}  // namespace idem::cleanup
