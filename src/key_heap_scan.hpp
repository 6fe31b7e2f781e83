// The steps of the direct path that run whole inside one pg_call, each behind its wrapper of
// src/pg/storage.hpp (and listed in test/lint/boundary.py's PG_FRAMES), and the primary-key
// probe that both the reads (key_heap.cpp) and the writes (key_heap_write.cpp) make. Internal
// to key_heap.
#pragma once

#include "key_heap.hpp"
#include "pg.hpp"
#include "reads.hpp"

namespace idem::key_heap {

// Looks up (owner, scope, key) in the primary key with `snapshot`, leaving the row in `slot`.
// Takes and releases the index scan's buffer pins; under SERIALIZABLE with an MVCC snapshot,
// nbtree and heapam take the predicate locks of what it read.
// pg-frame: runs inside pg_call only (owns no C++ object).
bool probe(Relation table, Relation primary_key, Snapshot snapshot, text* owner, text* scope,
           text* key, TupleTableSlot* slot);

// The snapshot of `read` (reads.hpp). For Read::kDirty it is `dirty`, initialised here (after
// a probe, its xmin and xmax name the open transactions of the version found).
// pg-frame: runs inside pg_call only (owns no C++ object).
Snapshot snapshot_of(Read read, SnapshotData* dirty);

// Under REPEATABLE READ or SERIALIZABLE: the row in `slot` (found by a dirty snapshot) is
// another transaction's, and invisible to this transaction's snapshot.
// pg-frame: runs inside pg_call only (owns no C++ object).
bool serialization_conflict(Relation table, TupleTableSlot* slot);

// What a read of one key wants from the version its probe finds.
enum class ReadFor {
  kFind,        // the row (find)
  kLook,        // the row the statement's snapshot sees, else what look() reports (Seen)
  kOpenWriter,  // no row: only whether the dirty snapshot names an open transaction
};
struct ReadOutcome {
  bool found;  // the probe found a version
  bool taken;  // that version is the row: the slot holds all its columns
  Seen seen;   // for ReadFor::kLook
};
// One read of (owner, scope, key): a slot made for `table` (left in `*slot`, for the caller
// to decode and drop), the probe with `read` (Read::kDirty uses `dirty`), and the decision
// `purpose` asks for (under ReadFor::kLook, 40001 for a version committed after the
// transaction's snapshot).
// pg-frame: runs inside pg::storage::read_key only (owns no C++ object).
ReadOutcome read_step(ReadFor purpose, Relation table, Relation primary_key, Read read,
                      SnapshotData* dirty, text* owner, text* scope, text* key,
                      TupleTableSlot** slot);

// Which index entries insert_index_entries adds: the primary key's only, every other index's,
// all of them, or the summarizing (BRIN) ones only (a HOT update that changed a column they
// cover, 16+).
enum class Indexes { kAll, kPrimaryKey, kOthers, kSummarizing };

// Adds the index entries of the heap tuple at `tid` (whose columns are values / nulls),
// as the executor would: unique indexes check uniqueness. For an update, `changed` has bit
// attnum - 1 set for each column that changed: an index over none of them gets the
// "unchanged" hint that lets B-Tree delete the older versions' entries bottom-up.
// `indexes` chooses among them (Indexes); the primary key checks uniqueness with
// `primary_key_check`. Returns what the primary key's index_insert returned (true when it was
// not among `indexes`): with UNIQUE_CHECK_PARTIAL, false means another live version of the
// key may exist, and nothing waited for it.
// pg-frame: runs inside pg::storage's insert_claim or add_index_entries only (owns no C++
// object).
bool insert_index_entries(Relation table, const OpenTable& open, Datum* values, bool* nulls,
                          ItemPointer tid, std::optional<uint64> changed,
                          Indexes indexes = Indexes::kAll,
                          IndexUniqueCheck primary_key_check = UNIQUE_CHECK_YES);

// The speculative insertion of a fresh claim (key_heap::insert, after its checks): the probe,
// the heap tuple, the primary key's entry (or the super-delete when another version won),
// the other indexes' entries, the confirmation. One step: the speculative-insertion lock is
// taken and released within it.
// pg-frame: runs inside pg::storage::insert_claim only (owns no C++ object).
InsertResult insert_step(OpenTable& open, Relation table, Relation primary_key, text* scope,
                         text* key, const ClaimValues& claim, key_store::RowAddress* where,
                         bool known_absent);

// The heap update of a completion (key_heap::complete, after its checks): false when the row
// at `where` is no longer the claim's live row (nothing written); else `values` / `nulls`
// hold the new row's columns, `*tuple` is the new version, `*changed` the columns that
// changed, and `*any_entries` / `*new_entries` which index entries it still needs.
// pg-frame: runs inside pg::storage::update_claimed_row only (owns no C++ object).
bool update_step(Relation table, const key_store::RowAddress& where, text* scope, text* key,
                 const pg_uuid_t& token, const key_store::Owner& owner, const Outcome& outcome,
                 TimestampTz now, TimestampTz expires_at, Datum* values, bool* nulls,
                 HeapTuple* tuple, uint64* changed, Indexes* new_entries, bool* any_entries);

}  // namespace idem::key_heap
