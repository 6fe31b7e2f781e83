// The reads of the direct path: primary-key probes of idempotency_keys (see key_heap.hpp).
#include "key_heap.hpp"

#include "key_heap_scan.hpp"
#include "key_layout.hpp"
#include "pg/storage.hpp"

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
Snapshot snapshot_of(Read read, SnapshotData* dirty) {
  switch (read) {
    case Read::kDirty:
      InitDirtySnapshot(*dirty);
      return dirty;
    case Read::kStatement:
      return GetActiveSnapshot();
    case Read::kLatest:
      return IsolationUsesXactSnapshot() ? GetActiveSnapshot() : GetLatestSnapshot();
    case Read::kNow:
      return GetLatestSnapshot();
    case Read::kSelf:
      return SnapshotSelf;
  }
  return GetActiveSnapshot();
}

// pg-frame: runs inside pg_call only (declared in key_heap_scan.hpp).
bool serialization_conflict(Relation table, TupleTableSlot* slot) {
  if (!IsolationUsesXactSnapshot()) return false;
  bool should_free = false;
  HeapTuple tuple = ExecFetchSlotHeapTuple(slot, false, &should_free);
  TransactionId inserter = HeapTupleHeaderGetXmin(tuple->t_data);
  if (should_free) heap_freetuple(tuple);
  return !TransactionIdIsCurrentTransactionId(inserter) &&
         !table_tuple_satisfies_snapshot(table, slot, snapshot_of(Read::kStatement, nullptr));
}

Relation OpenTable::table() {
  const bool opening = table_ == nullptr;
  if (opening) table_ = pg::storage::open_table(oid_, RowExclusiveLock);
  (void)key_layout::of(table_);  // a reload (after an invalidation) is checked again
  if (opening) route_.table_opened(table_);
  return table_;
}

int OpenTable::primary_key_position() {
  const key_layout::Layout& layout = key_layout::of(table());
  for (int i = 0; i < layout.index_count; ++i)
    if (layout.index_oids[i] == layout.primary_key) return i;
  return -1;
}

Relation OpenTable::primary_key() {
  const Oid wanted = key_layout::of(table()).primary_key;
  if (primary_key_ != nullptr && RelationGetRelid(primary_key_) == wanted) return primary_key_;
  if (primary_key_alone_) pg::storage::close_index(primary_key_);
  primary_key_ = nullptr;
  primary_key_alone_ = false;
  const int position = primary_key_position();
  if (position >= 0 && position < index_count_ && RelationGetRelid(indexes_[position]) == wanted) {
    primary_key_ = indexes_[position];
  } else {
    primary_key_ = pg::storage::open_index(wanted, RowExclusiveLock);
    primary_key_alone_ = true;
  }
  return primary_key_;
}

void OpenTable::open_indexes() {
  const key_layout::Layout& layout = key_layout::of(table());
  // The indexes opened so far must still be the layout's, in its order (a layout reloaded
  // after an invalidation may list others): else start again.
  bool same = index_count_ <= layout.index_count;
  for (int i = 0; same && i < index_count_; ++i)
    same = RelationGetRelid(indexes_[i]) == layout.index_oids[i];
  pg::storage::open_indexes(layout.index_oids, layout.index_count, RowExclusiveLock, !same,
                            indexes_, &index_count_);
  if (!same && !primary_key_alone_) primary_key_ = nullptr;
}

bool OpenTable::owner_may(AclMode privileges) {
  if ((granted_ & privileges) == privileges) return true;
  if ((refused_ & privileges) != 0) return false;
  // Table work always runs as the extension owner (caller::ActingAsOwner), so GetUserId() is
  // that owner here: the check matters only if a superuser revoked the owner's own rights.
  const AclMode held = pg::storage::user_privileges(oid_, privileges);
  granted_ |= held;
  refused_ |= privileges & ~held;
  return held == privileges;
}

void OpenTable::close() {
  pg::storage::close_relations(indexes_, index_count_, primary_key_alone_ ? primary_key_ : nullptr,
                               table_);
  table_ = nullptr;
  primary_key_ = nullptr;
  primary_key_alone_ = false;
  index_count_ = 0;
}

// pg-frame: runs inside pg::storage::read_key only (declared in key_heap_scan.hpp).
ReadOutcome read_step(ReadFor purpose, Relation table, Relation primary_key, Read read,
                      SnapshotData* dirty, text* owner, text* scope, text* key,
                      TupleTableSlot** slot) {
  *slot = table_slot_create(table, nullptr);
  ReadOutcome outcome{};
  outcome.seen = Seen::kNothing;
  outcome.found = probe(table, primary_key, snapshot_of(read, dirty), owner, scope, key, *slot);
  switch (purpose) {
    case ReadFor::kFind:
      outcome.taken = outcome.found;
      break;
    case ReadFor::kLook:
      if (!outcome.found) break;
      // The version found is the statement's row when the statement's snapshot sees it
      // (never so for a version of another open transaction): of the versions of one key,
      // that snapshot sees at most one.
      if (table_tuple_satisfies_snapshot(table, *slot, snapshot_of(Read::kStatement, nullptr))) {
        outcome.seen = Seen::kRow;
        outcome.taken = true;
        break;
      }
      // Neither an open transaction's version nor this transaction's own (a later command's):
      // one committed after the snapshot.
      if (!TransactionIdIsValid(dirty->xmin) && serialization_conflict(table, *slot))
        raise_committed_after_snapshot(key);
      outcome.seen = Seen::kUndecided;
      break;
    case ReadFor::kOpenWriter:
      break;
  }
  if (outcome.taken) slot_getallattrs(*slot);
  return outcome;
}

namespace {

// Probes the primary key for (owner, scope, key) with `read` (Read::kDirty uses `dirty`) and
// decides as `purpose` asks (read_step); a version taken is decoded into `*row`.
ReadOutcome read_key(OpenTable& open, ReadFor purpose, text* owner, text* scope, text* key,
                     Read read, SnapshotData* dirty, MemoryContext context,
                     std::optional<KeyRow>* row) {
  // No privilege check, unlike the writes: every caller acts as the extension owner, who owns
  // the table (caller.hpp); the caller's own rights are never what reads it.
  // The table and the primary key are locked as an INSERT locks them (claim_key may write
  // next): the write then finds its locks already held, instead of taking a second mode.
  Relation relation = open.table();
  Relation primary_key = open.primary_key();
  // On an error, transaction abort releases what is open here (relations, pins, slot).
  TupleTableSlot* slot = nullptr;
  const ReadOutcome outcome =
      pg::storage::read_key(purpose, relation, primary_key, read, dirty, owner, scope, key, &slot);
  if (outcome.taken) *row = key_layout::decode_values(slot->tts_values, slot->tts_isnull, context);
  pg::storage::drop_slot(slot);
  return outcome;
}

}  // namespace

std::optional<KeyRow> find(OpenTable& table, text* owner, text* scope, text* key,
                           MemoryContext context, Read read) {
  std::optional<KeyRow> row;
  // An MVCC probe: under SERIALIZABLE, B-Tree and heap take the predicate locks on what it saw
  // (the leaf page, the tuple), as a SELECT's index scan does.
  read_key(table, ReadFor::kFind, owner, scope, key, read, nullptr, context, &row);
  return row;
}

Seen look(OpenTable& table, text* owner, text* scope, text* key, MemoryContext context,
          std::optional<KeyRow>* row) {
  SnapshotData dirty;
  return read_key(table, ReadFor::kLook, owner, scope, key, Read::kDirty, &dirty, context, row)
      .seen;
}

bool written_by_open_transaction(OpenTable& table, text* owner, text* scope, text* key) {
  SnapshotData dirty;
  std::optional<KeyRow> unused;
  const ReadOutcome outcome = read_key(table, ReadFor::kOpenWriter, owner, scope, key, Read::kDirty,
                                       &dirty, CurrentMemoryContext, &unused);
  // The dirty snapshot sets xmin for a version another open transaction inserted, xmax for
  // one another open transaction updates or deletes (never for this transaction's own).
  return outcome.found && (TransactionIdIsValid(dirty.xmin) || TransactionIdIsValid(dirty.xmax));
}

}  // namespace idem::key_heap
