// The reads of the direct path: primary-key probes of idempotency_keys (see key_heap.hpp).
#include "key_heap.hpp"

#include "key_heap_scan.hpp"
#include "key_layout.hpp"

namespace idem::key_heap {

// pg-frame: runs inside pg_call only (declared in key_heap_scan.hpp).
bool probe(Relation table, Relation primary_key, Snapshot snapshot, text* owner, text* scope,
           text* key, TupleTableSlot* slot) {
  // In the index's column order (key, scope, owner), as B-Tree scans require.
  ScanKeyData keys[3];
  ScanKeyInit(&keys[0], 1, BTEqualStrategyNumber, F_TEXTEQ, PointerGetDatum(key));
  ScanKeyInit(&keys[1], 2, BTEqualStrategyNumber, F_TEXTEQ, PointerGetDatum(scope));
  ScanKeyInit(&keys[2], 3, BTEqualStrategyNumber, F_TEXTEQ, PointerGetDatum(owner));
#if PG_VERSION_NUM >= 190000  // index_beginscan gained a flags argument
  IndexScanDesc scan = index_beginscan(table, primary_key, snapshot, nullptr, 3, 0, SO_NONE);
#elif PG_VERSION_NUM >= 180000  // index_beginscan gained an instrumentation argument
  IndexScanDesc scan = index_beginscan(table, primary_key, snapshot, nullptr, 3, 0);
#else
  IndexScanDesc scan = index_beginscan(table, primary_key, snapshot, 3, 0);
#endif
  index_rescan(scan, keys, 3, nullptr, 0);
  bool found = index_getnext_slot(scan, ForwardScanDirection, slot);
  index_endscan(scan);
  return found;
}

// pg-frame: runs inside pg_call only (declared in key_heap_scan.hpp).
bool serialization_conflict(Relation table, TupleTableSlot* slot) {
  if (!IsolationUsesXactSnapshot()) return false;
  bool should_free = false;
  HeapTuple tuple = ExecFetchSlotHeapTuple(slot, false, &should_free);
  TransactionId inserter = HeapTupleHeaderGetXmin(tuple->t_data);
  if (should_free) heap_freetuple(tuple);
  return !TransactionIdIsCurrentTransactionId(inserter) &&
         !table_tuple_satisfies_snapshot(table, slot, GetActiveSnapshot());
}

namespace {

// Probes the primary key for (owner, scope, key) with `snapshot`. `take` gets the table and
// the slot holding the version found (nullptr when there is none) and says whether that
// version is the row to decode into `*row`.
template <typename Take>
void read_key(Oid table, text* owner, text* scope, text* key, Snapshot snapshot,
              MemoryContext context, std::optional<KeyRow>* row, Take&& take) {
  // No privilege check, unlike the writes: every caller acts as the extension owner, who owns
  // the table (caller.hpp); the caller's own rights are never what reads it.
  // The lock an INSERT takes (claim_key may write next): the write then finds its locks
  // already held, instead of taking a second mode of each.
  Relation relation = pg_call([&] { return table_open(table, RowExclusiveLock); });
  const key_layout::Layout& layout = key_layout::of(relation);
  // On an error, transaction abort releases what is open here (relations, pins, slot).
  TupleTableSlot* slot = nullptr;
  bool taken = pg_call([&] {
    Relation primary_key = index_open(layout.primary_key, RowExclusiveLock);
    slot = table_slot_create(relation, nullptr);
    bool hit = probe(relation, primary_key, snapshot, owner, scope, key, slot);
    index_close(primary_key, NoLock);
    return take(relation, hit ? slot : nullptr);
  });
  if (taken) {
    pg_call([&] { slot_getallattrs(slot); });
    *row = key_layout::decode_values(slot->tts_values, slot->tts_isnull, context);
  }
  pg_call([&] {
    ExecDropSingleTupleTableSlot(slot);
    table_close(relation, NoLock);
  });
}

}  // namespace

std::optional<KeyRow> find(Oid table, text* owner, text* scope, text* key, MemoryContext context,
                           bool latest) {
  std::optional<KeyRow> row;
  // An MVCC probe: under SERIALIZABLE, B-Tree and heap take the predicate locks on what it saw
  // (the leaf page, the tuple), as a SELECT's index scan does.
  Snapshot snapshot =
      latest && !IsolationUsesXactSnapshot() ? GetLatestSnapshot() : GetActiveSnapshot();
  read_key(table, owner, scope, key, snapshot, context, &row,
           [](Relation, TupleTableSlot* slot) { return slot != nullptr; });
  return row;
}

Seen look(Oid table, text* owner, text* scope, text* key, MemoryContext context,
          std::optional<KeyRow>* row) {
  SnapshotData dirty;
  InitDirtySnapshot(dirty);
  Seen seen = Seen::kNothing;
  read_key(table, owner, scope, key, &dirty, context, row,
           [&](Relation relation, TupleTableSlot* slot) {
             if (slot == nullptr) return false;
             // The version found is the statement's row when the statement's snapshot sees
             // it (never so for a version of another open transaction): of the versions of
             // one key, that snapshot sees at most one.
             if (table_tuple_satisfies_snapshot(relation, slot, GetActiveSnapshot())) {
               seen = Seen::kRow;
               return true;
             }
             // Neither an open transaction's version nor this transaction's own (a later
             // command's): one committed after the snapshot.
             if (!TransactionIdIsValid(dirty.xmin) && serialization_conflict(relation, slot))
               raise_committed_after_snapshot(key);
             seen = Seen::kUndecided;
             return false;
           });
  return seen;
}

}  // namespace idem::key_heap
