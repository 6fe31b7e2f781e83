// The writes of the direct path: a new claim inserted speculatively, the completion of a
// claim this transaction made (see key_heap.hpp).
#include "key_heap.hpp"

#include "key_heap_scan.hpp"
#include "key_layout.hpp"
#include "pg/storage.hpp"

namespace idem::key_heap {
namespace {

using key_layout::kMaxAttributes;
using namespace key_store;  // NOLINT(google-build-using-namespace): the column names

// Opens the table for `command`; false when the executor must do the write (the call's
// route says the table needs its machinery, or a privilege is missing: the executor then
// reports it). The indexes are opened by open_indexes, when the write needs them.
bool open_writer(OpenTable& open, AclMode privileges, const char* command) {
  pg::storage::check_writable(command);
  (void)open.table();
  return open.route().direct_writes() && open.owner_may(privileges);
}

// Is `index` summarizing: does a HOT update still owe it an entry (PostgreSQL 16+)?
bool is_summarizing(const IndexInfo* info) {
#if PG_VERSION_NUM >= 160000
  return info->ii_Summarizing;
#else
  (void)info;
  return false;
#endif
}

// index_insert into a BRIN index, whose insert keeps state in ii_AmCache (the BRIN's
// descriptor; on 17+ the range map's metapage pinned): kept for the transaction's later
// inserts, its pins held by the top resource owner, released at the transaction's end
// (key_layout.hpp). Its own PG_TRY: the resource owner is switched back on an error too.
// pg-frame: runs inside insert_index_entries only (owns no C++ object).
void insert_brin_entry(Relation index, IndexInfo* info, Datum* key_values, bool* key_nulls,
                       ItemPointer tid, Relation table, bool unchanged) {
  info->ii_Context = key_layout::insert_states_context();
  ResourceOwner saved = CurrentResourceOwner;
  CurrentResourceOwner = TopTransactionResourceOwner;
  PG_TRY();
  { index_insert(index, key_values, key_nulls, tid, table, UNIQUE_CHECK_NO, unchanged, info); }
  PG_FINALLY();
  {
    CurrentResourceOwner = saved;
    if (info->ii_AmCache != nullptr) key_layout::insert_states_kept();
  }
  PG_END_TRY();
}
// After a HOT update that changed a column only summarizing indexes cover (16+): does every
// such index already hold the new version's key? The expiry index's key is the expiry's
// minute, and a HOT update leaves the new version in the old one's block, whose range's
// summary holds the old version's minute (its insert put it there, or a summarization read
// it: summaries only widen). An unchanged minute then needs no entry; the executor, which
// compares columns and not keys, would add one that changes nothing.
#if PG_VERSION_NUM >= 160000
bool summaries_hold(TimestampTz old_expiry, TimestampTz new_expiry) {
  const key_layout::Layout& layout = key_layout::current();
  if (key_layout::expiry_bucket(old_expiry) != key_layout::expiry_bucket(new_expiry)) return false;
  for (int i = 0; i < layout.index_count; ++i)
    if (is_summarizing(layout.index_info[i]) && !layout.on_expiry_bucket[i]) return false;
  return true;
}
#endif

// The table's current file (its relfilenode).
Oid file_of(Relation table) {
#if PG_VERSION_NUM >= 160000
  return table->rd_locator.relNumber;
#else
  return table->rd_node.relNode;
#endif
}

// Did this transaction create the table's current file? Only such a file is truncated in
// place by a TRUNCATE (and counting its blocks costs a system call, so only then).
bool file_is_new(Relation table) {
#if PG_VERSION_NUM >= 160000
  return table->rd_createSubid != InvalidSubTransactionId ||
         table->rd_firstRelfilelocatorSubid != InvalidSubTransactionId;
#else
  return table->rd_createSubid != InvalidSubTransactionId ||
         table->rd_firstRelfilenodeSubid != InvalidSubTransactionId;
#endif
}

// pg-frame: runs inside update_step only (owns no C++ object).
bool same_text(Datum stored, const text* given) {
  struct varlena* value = pg_detoast_datum_packed(reinterpret_cast<struct varlena*>(stored));
  return VARSIZE_ANY_EXHDR(value) == VARSIZE_ANY_EXHDR(given) &&
         memcmp(VARDATA_ANY(value), VARDATA_ANY(given), VARSIZE_ANY_EXHDR(given)) == 0;
}

// What a dirty snapshot finds in the primary key for (owner, scope, key).
enum class Found { kNothing, kRow, kOpenClaim };

// Probes with a dirty snapshot: committed versions and those of transactions still open.
// A version that another open transaction inserted is a claim in flight (kOpenClaim); any
// other live version (committed, this transaction's own, or one that an open transaction
// is deleting or updating) is a row for the caller to decide from again (kRow).
// pg-frame: runs inside insert_step only (owns no C++ object).
Found probe_dirty(Relation table, Relation primary_key, text* owner, text* scope, text* key) {
  TupleTableSlot* slot = table_slot_create(table, nullptr);
  SnapshotData dirty;
  bool exists =
      probe(table, primary_key, snapshot_of(Read::kDirty, &dirty), owner, scope, key, slot);
  // The inserter of the version found, when its transaction is still open (never ours:
  // the dirty snapshot leaves xmin unset for this transaction's own versions).
  const bool open_insert = exists && TransactionIdIsValid(dirty.xmin);
  bool conflict = exists && !open_insert && serialization_conflict(table, slot);
  ExecDropSingleTupleTableSlot(slot);
  if (conflict) raise_committed_after_snapshot(key);
  if (open_insert) return Found::kOpenClaim;
  return exists ? Found::kRow : Found::kNothing;
}

// The columns of a new claim of (claim.owner, scope, key), by attribute number - 1: what the
// executor path's INSERT of a claim (key_store.cpp, kInsert) writes; the columns it leaves
// out are NULL (the layout check sends a table with a default on one of them to the
// executor).
void new_claim_values(const ClaimValues& claim, text* scope, text* key, Datum* values,
                      bool* nulls) {
  const key_layout::Layout& layout = key_layout::current();
  for (int i = 0; i < kMaxAttributes; ++i) nulls[i] = true;
  auto set = [&](Column column, Datum value) {
    values[layout.attnum[column] - 1] = value;
    nulls[layout.attnum[column] - 1] = false;
  };
  set(kScope, PointerGetDatum(scope));
  set(kKey, PointerGetDatum(key));
  set(kOwner, PointerGetDatum(claim.owner));
  if (claim.fingerprint != nullptr) set(kFingerprint, PointerGetDatum(claim.fingerprint));
  set(kAttempts, Int32GetDatum(1));
  set(kTtl, IntervalPGetDatum(&claim.ttl));
  set(kLease, IntervalPGetDatum(&claim.lease));
  set(kCreatedAt, TimestampTzGetDatum(claim.now));
  set(kExpiresAt, TimestampTzGetDatum(claim.expires_at));
  set(kLeaseToken, UUIDPGetDatum(&claim.token));
  set(kLockedUntil, TimestampTzGetDatum(claim.locked_until));
  set(kStatus, ObjectIdGetDatum(layout.processing_label));
  set(kUpdatedAt, TimestampTzGetDatum(claim.now));
  set(kOwnerOid, ObjectIdGetDatum(claim.owner_oid));
  set(kOwnerSystem, Int64GetDatum(claim.owner_system));
}

// The fence of a completion, on the columns of the row at the claim's address: `token`
// holds a live processing row of (owner, scope, key) that is the owner's (key_row.hpp,
// belongs_to). The executor path's statements state
// the same condition in SQL (key_store.cpp, kWhereHolder); test/pgtap/completion_fence.sql
// proves the two equal.
// pg-frame: runs inside update_step only (owns no C++ object).
bool holds(const Datum* values, const bool* nulls, const pg_uuid_t& token,
           const key_store::Owner& owner, text* scope, text* key, TimestampTz now) {
  const key_layout::Layout& layout = key_layout::current();
  auto at = [&](Column column) { return layout.attnum[column] - 1; };
  return !nulls[at(kLeaseToken)] &&
         memcmp(DatumGetUUIDP(values[at(kLeaseToken)])->data, token.data, UUID_LEN) == 0 &&
         same_text(values[at(kOwner)], owner.name) &&
         (nulls[at(kOwnerOid)] || nulls[at(kOwnerSystem)] ||
          DatumGetInt64(values[at(kOwnerSystem)]) != owner.system ||
          DatumGetObjectId(values[at(kOwnerOid)]) == owner.role) &&
         DatumGetObjectId(values[at(kStatus)]) == layout.processing_label &&
         DatumGetTimestampTz(values[at(kExpiresAt)]) > now &&
         same_text(values[at(kScope)], scope) && same_text(values[at(kKey)], key);
}

// The columns of a completion, written over those of the claim: what the executor path's
// UPDATE (key_store.cpp, kComplete) sets. Returns the columns that change, as a bit per
// attribute number - 1 (for the indexes' "unchanged" hint).
uint64 completion_values(const Outcome& outcome, TimestampTz now, TimestampTz expires_at,
                         Datum* values, bool* nulls) {
  const key_layout::Layout& layout = key_layout::current();
  auto at = [&](Column column) { return layout.attnum[column] - 1; };
  uint64 changed = 0;
  for (Column column : {kStatus, kResponseCode, kUpdatedAt, kResponse, kResponseBody,
                        kResponseHeaders, kResponseExpiresAt})
    changed |= uint64{1} << at(column);
  if (DatumGetTimestampTz(values[at(kExpiresAt)]) != expires_at)
    changed |= uint64{1} << at(kExpiresAt);
  values[at(kStatus)] = ObjectIdGetDatum(layout.completed_label);
  values[at(kResponseCode)] = Int32GetDatum(outcome.response_code.value_or(0));
  nulls[at(kResponseCode)] = !outcome.response_code;
  values[at(kUpdatedAt)] = TimestampTzGetDatum(now);
  values[at(kResponse)] = PointerGetDatum(outcome.response);
  nulls[at(kResponse)] = outcome.response == nullptr;
  values[at(kResponseBody)] = PointerGetDatum(outcome.response_body);
  nulls[at(kResponseBody)] = outcome.response_body == nullptr;
  values[at(kResponseHeaders)] = PointerGetDatum(outcome.response_headers);
  nulls[at(kResponseHeaders)] = outcome.response_headers == nullptr;
  values[at(kExpiresAt)] = TimestampTzGetDatum(expires_at);
  values[at(kResponseExpiresAt)] = TimestampTzGetDatum(outcome.response_expires_at.value_or(0));
  nulls[at(kResponseExpiresAt)] = !outcome.response_expires_at;
  return changed;
}

}  // namespace

// pg-frame: runs inside pg::storage's insert_claim or add_index_entries only (declared in
// key_heap_scan.hpp).
bool insert_index_entries(Relation table, const OpenTable& open, Datum* values, bool* nulls,
                          ItemPointer tid, std::optional<uint64> changed, Indexes indexes,
                          IndexUniqueCheck primary_key_check) {
  bool unique = true;
  for (int i = 0; i < open.index_count(); ++i) {
    Relation index = open.index(i);
    const bool is_primary_key = RelationGetRelid(index) == key_layout::current().primary_key;
    IndexInfo* info = key_layout::current().index_info[i];
    if ((indexes == Indexes::kPrimaryKey && !is_primary_key) ||
        (indexes == Indexes::kOthers && is_primary_key) ||
        (indexes == Indexes::kSummarizing && !is_summarizing(info)))
      continue;
    if (!index->rd_index->indisready) continue;  // being built concurrently
    Datum key_values[INDEX_MAX_KEYS];
    bool key_nulls[INDEX_MAX_KEYS];
    uint64 columns = 0;
    if (key_layout::current().on_expiry_bucket[i]) {
      // The expiry index of 16+ (key_layout.hpp): the one expression the layout allows.
      const int expires_at = key_layout::current().attnum[kExpiresAt] - 1;
      key_values[0] =
          TimestampTzGetDatum(key_layout::expiry_bucket(DatumGetTimestampTz(values[expires_at])));
      key_nulls[0] = nulls[expires_at];
      columns = uint64{1} << expires_at;
    } else {
      for (int k = 0; k < info->ii_NumIndexAttrs; ++k) {
        AttrNumber attnum = info->ii_IndexAttrNumbers[k];
        key_values[k] = values[attnum - 1];
        key_nulls[k] = nulls[attnum - 1];
        columns |= uint64{1} << (attnum - 1);
      }
    }
    bool unchanged = changed && (columns & *changed) == 0;
    IndexUniqueCheck check = !index->rd_index->indisunique ? UNIQUE_CHECK_NO
                             : is_primary_key              ? primary_key_check
                                                           : UNIQUE_CHECK_YES;
    if (index->rd_rel->relam == BRIN_AM_OID) {
      insert_brin_entry(index, info, key_values, key_nulls, tid, table, unchanged);
      continue;
    }
    bool result = index_insert(index, key_values, key_nulls, tid, table, check, unchanged, info);
    if (is_primary_key && check == UNIQUE_CHECK_PARTIAL) unique = result;
  }
  return unique;
}

// pg-frame: runs inside pg::storage::insert_claim only (declared in key_heap_scan.hpp).
InsertResult insert_step(OpenTable& open, Relation table, Relation primary_key, text* scope,
                         text* key, const ClaimValues& claim, key_store::RowAddress* where,
                         bool known_absent) {
  switch (known_absent ? Found::kNothing
                       : probe_dirty(table, primary_key, claim.owner, scope, key)) {
    case Found::kOpenClaim:
      return InsertResult::kBusy;
    case Found::kRow:
      return InsertResult::kExists;
    case Found::kNothing:
      break;
  }

  Datum values[kMaxAttributes];
  bool nulls[kMaxAttributes];
  new_claim_values(claim, scope, key, values, nulls);
  HeapTuple tuple = heap_form_tuple(RelationGetDescr(table), values, nulls);
  // The speculative-insertion lock is held only between the insert and its confirmation
  // or super-delete (one lock-manager entry at a time, never one per claim kept): whoever
  // meets the tuple meanwhile waits on it (SpeculativeInsertionWait), not on this
  // transaction.
  const TransactionId xid = GetCurrentTransactionId();
  const uint32 token = SpeculativeInsertionLockAcquire(xid);
  HeapTupleHeaderSetSpeculativeToken(tuple->t_data, token);
  heap_insert(table, tuple, GetCurrentCommandId(true), HEAP_INSERT_SPECULATIVE, nullptr);
  if (!insert_index_entries(table, open, values, nulls, &tuple->t_self, std::nullopt,
                            Indexes::kPrimaryKey, UNIQUE_CHECK_PARTIAL)) {
    // Another version of the key got its entry in first: take ours back and answer from
    // theirs (an open claim: in_progress; else the caller decides again).
    heap_abort_speculative(table, &tuple->t_self);
    SpeculativeInsertionLockRelease(xid);
    heap_freetuple(tuple);
    return probe_dirty(table, primary_key, claim.owner, scope, key) == Found::kOpenClaim
               ? InsertResult::kBusy
               : InsertResult::kExists;
  }
  insert_index_entries(table, open, values, nulls, &tuple->t_self, std::nullopt, Indexes::kOthers);
  heap_finish_speculative(table, &tuple->t_self);
  SpeculativeInsertionLockRelease(xid);
  *where = {tuple->t_self, file_of(table)};
  heap_freetuple(tuple);
  // Later statements of this call (a completion in the same SQL statement) see the row.
  CommandCounterIncrement();
  return InsertResult::kInserted;
}

// pg-frame: runs inside pg::storage::update_claimed_row only (declared in key_heap_scan.hpp).
bool update_step(Relation table, const key_store::RowAddress& where, text* scope, text* key,
                 const pg_uuid_t& token, const key_store::Owner& owner, const Outcome& outcome,
                 TimestampTz now, TimestampTz expires_at, Datum* values, bool* nulls,
                 HeapTuple* tuple, uint64* changed, Indexes* new_entries, bool* any_entries) {
  CheckCmdReplicaIdentity(table, CMD_UPDATE);
  TupleDesc desc = RelationGetDescr(table);
  if (where.file != file_of(table)) return false;  // truncated or rewritten since
  // A TRUNCATE of a file created in this same transaction (by an earlier TRUNCATE, a
  // CLUSTER or CREATE EXTENSION) empties that file in place: the TID may point past its end.
  if (file_is_new(table) &&
      ItemPointerGetBlockNumber(&where.tid) >= RelationGetNumberOfBlocks(table))
    return false;
  HeapTupleData old;
  old.t_self = where.tid;
  Buffer buffer = InvalidBuffer;
  // Read::kSelf: the version this transaction sees now; an updated or deleted one is not.
  if (!heap_fetch(table, snapshot_of(Read::kSelf, nullptr), &old, &buffer, false)) return false;
  heap_deform_tuple(&old, desc, values, nulls);
#if PG_VERSION_NUM >= 160000
  const int expiry_column = key_layout::current().attnum[kExpiresAt] - 1;
  const TimestampTz old_expiry = DatumGetTimestampTz(values[expiry_column]);
#endif
  if (!holds(values, nulls, token, owner, scope, key, now)) {
    ReleaseBuffer(buffer);
    return false;
  }
  *changed = completion_values(outcome, now, expires_at, values, nulls);
  // The pin kept the old tuple's bytes in place until they are copied here.
  *tuple = heap_form_tuple(desc, values, nulls);
  ReleaseBuffer(buffer);
  // As the executor: every index gets an entry, none (a HOT update), or, on 16+, only the
  // summarizing ones (a HOT update that changed a column only they cover: expires_at under
  // the BRIN of 16+).
#if PG_VERSION_NUM >= 160000
  TU_UpdateIndexes update_indexes = TU_All;
  simple_heap_update(table, &old.t_self, *tuple, &update_indexes);
  *any_entries = update_indexes != TU_None;
  if (update_indexes == TU_Summarizing) {
    *new_entries = Indexes::kSummarizing;
    *any_entries = !summaries_hold(old_expiry, DatumGetTimestampTz(values[expiry_column]));
  }
#else
  (void)new_entries;  // every index gets an entry, or none: no summarizing-only update
  simple_heap_update(table, &old.t_self, *tuple);
  *any_entries = !HeapTupleIsHeapOnly(*tuple);
#endif
  heap_deform_tuple(*tuple, desc, values, nulls);
  return true;
}

InsertResult insert(OpenTable& open, text* scope, text* key, const ClaimValues& claim,
                    key_store::RowAddress* where, bool known_absent) {
  if (!open_writer(open, ACL_INSERT, "INSERT")) return InsertResult::kNeedsExecutor;
  open.open_indexes();
  Relation table = open.table();
  Relation primary_key = open.primary_key();
  // No per-key lock: the primary key is the arbiter (docs/design-batch.md, "Claims without
  // per-key locks"). A version of the key that a dirty snapshot sees answers at once; else
  // the row is inserted speculatively, as INSERT .. ON CONFLICT does, and the primary key's
  // entry added with a partial unique check, which never waits. Of concurrent inserters of
  // one key the first to add its entry wins: every later one finds that entry live, takes
  // its own tuple back (a super-delete, which makes it dead to everyone at once) and
  // answers from the winner's version.
  return pg::storage::insert_claim(open, table, primary_key, scope, key, claim, where,
                                   known_absent);
}

std::optional<KeyRow> complete(OpenTable& open, const key_store::RowAddress& where, text* scope,
                               text* key, const pg_uuid_t& token, const key_store::Owner& owner,
                               const Outcome& outcome, TimestampTz now, TimestampTz expires_at,
                               MemoryContext context) {
  if (!open_writer(open, ACL_UPDATE | ACL_SELECT, "UPDATE")) return std::nullopt;
  Relation table = open.table();
  // The new row's columns; varlenas point into the new tuple (palloc'd, so they stay).
  Datum values[kMaxAttributes];
  bool nulls[kMaxAttributes];
  HeapTuple tuple = nullptr;
  uint64 changed = 0;
  Indexes new_entries = Indexes::kAll;
  bool any_entries = false;
  const bool updated = pg::storage::update_claimed_row(
      table, where, scope, key, token, owner, outcome, now, expires_at, values, nulls, &tuple,
      &changed, &new_entries, &any_entries);
  if (!updated) return std::nullopt;
  // A HOT update needs no index entry; the indexes are opened only for new entries (this
  // transaction's insert of the row already holds their locks).
  if (any_entries) {
    open.open_indexes();
    pg::storage::add_index_entries(table, open, values, nulls, &tuple->t_self, changed,
                                   new_entries);
  }
  pg::storage::make_writes_visible();
  return key_layout::decode_values(values, nulls, context);
}

}  // namespace idem::key_heap
