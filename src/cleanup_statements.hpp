// The statements of the cleanup (cleanup.hpp): a batch of expired keys, the keys of dropped
// roles in a range of heap blocks, and the relations that hold keys on this node (the table,
// or its Citus shard placements). Their plans are kept by the process for the relation they
// were made for. Each function needs an open SPI connection and runs as the extension owner
// (cleanup.cpp's batch transaction provides both).
#pragma once

#include "pg.hpp"

namespace idem::cleanup::statements {

struct Batch {
  uint64 deleted = 0;
  bool full = false;  // a relation gave batch_size rows, or the walk wrapped: more may be left
};

// Where a run of batches of expired keys stands. Under a B-Tree on expires_at, the largest
// expiry deleted (the next batch's lower bound). Under a BRIN (16+) no index gives an order:
// the first batch of a run that starts at block 0 takes the first expired keys in block order
// (read by the BRIN's bitmap or sequentially), and every later batch goes on from the block
// where the last one stopped by a TID range scan to the end of the table; a run that started
// further on (an unfinished round's successor) then wraps once to [0, start). Each block is
// read about once per run, not once per batch. A Citus node's shards are walked as before
// (each batch from the start: `expiry` and the blocks are the table's).
struct Cursor {
  TimestampTz expiry = DT_NOBEGIN;  // B-Tree: the next lower bound of expires_at
  BlockNumber start = 0;            // BRIN: the block the run started at
  BlockNumber block = 0;            // BRIN: where the next batch starts
  bool walking = false;             // BRIN: a batch ran (the next one reads a TID range)
  bool wrapped = false;             // BRIN: past the end, now in [0, start)
};

// One batch of expired keys (expires_at <= now) in every relation that holds keys here,
// from where `cursor` stands; moves it on.
Batch delete_expired(Oid table, TimestampTz now, Cursor& cursor, int batch_size);

// Up to `limit` keys of dropped or renamed roles in the blocks [from, to) of `relation`: how
// many were deleted, and whether any was skipped, locked by another transaction (FOR UPDATE
// SKIP LOCKED: the cleanup never waits), so that the pass is not complete. Then the keys of
// the range written elsewhere or before 1.3 whose owner names a role are stamped with that
// role (adopted).
struct Orphans {
  uint64 deleted = 0;
  uint64 adopted = 0;
  bool skipped = false;
};
Orphans delete_orphans_in(Oid relation, BlockNumber from, BlockNumber to, int limit);

// One batch of responses past their time (complete_key's response_ttl, 1.3) in every relation
// that holds keys here: response, response_body and response_headers set to NULL in up to
// `batch_size` rows each (FOR UPDATE SKIP LOCKED), the keys kept as tombstones until they
// expire. Returns how many rows were changed, and whether a relation gave batch_size rows.
Batch drop_responses(Oid table, TimestampTz now, int batch_size);
// The relations that hold keys on this node, in OID order (a pass walks them in that order
// across rounds).
std::vector<Oid> key_relations(Oid table);

// The number of heap blocks of `relation`.
BlockNumber relation_blocks(Oid relation);

}  // namespace idem::cleanup::statements
