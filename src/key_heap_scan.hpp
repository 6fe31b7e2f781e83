// The primary-key probe that both the reads (key_heap.cpp) and the writes
// (key_heap_write.cpp) of the direct path make. Internal to key_heap.
#pragma once

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

}  // namespace idem::key_heap
