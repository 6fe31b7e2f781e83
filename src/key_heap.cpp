// Direct heap and index access to idempotency_keys (see key_heap.hpp).
#include "key_heap.hpp"

#include "citus_guard.hpp"
#include "gucs.hpp"

namespace idem::key_heap {
namespace {

enum Column {
  kScope,
  kKey,
  kOwner,
  kFingerprint,
  kAttempts,
  kTtl,
  kLease,
  kCreatedAt,
  kExpiresAt,
  kLeaseToken,
  kLockedUntil,
  kRecoveryPoint,
  kStatus,
  kResponseCode,
  kUpdatedAt,
  kResponse,
  kResponseBody,
  kResponseHeaders,
  kColumnCount
};
// Each column as the scripts create it (1.0, and the response as sent added by 1.2). A NOT NULL
// added to another column is a constraint the direct path would not check, so such a table goes to
// the executor. The status column is the extension's enum, checked by its kind (type InvalidOid
// here). `claim_writes`: the executor's INSERT of a claim lists the column, so a default of it is
// never used; for the others the executor would fill in their default.
struct ColumnSpec {
  const char* name;
  Oid type;
  const char* type_name;
  bool not_null;
  bool claim_writes;
};
constexpr ColumnSpec kColumns[kColumnCount] = {
    {"scope", TEXTOID, "text", true, true},
    {"key", TEXTOID, "text", true, true},
    {"owner", TEXTOID, "text", true, true},
    {"fingerprint", BYTEAOID, "bytea", false, true},
    {"attempts", INT4OID, "integer", true, true},
    {"ttl", INTERVALOID, "interval", true, true},
    {"lease", INTERVALOID, "interval", true, true},
    {"created_at", TIMESTAMPTZOID, "timestamptz", true, true},
    {"expires_at", TIMESTAMPTZOID, "timestamptz", true, true},
    {"lease_token", UUIDOID, "uuid", false, true},
    {"locked_until", TIMESTAMPTZOID, "timestamptz", false, true},
    {"recovery_point", TEXTOID, "text", false, false},
    {"status", InvalidOid, "key_status", true, true},
    {"response_code", INT4OID, "integer", false, false},
    {"updated_at", TIMESTAMPTZOID, "timestamptz", true, true},
    {"response", JSONBOID, "jsonb", false, false},
    {"response_body", BYTEAOID, "bytea", false, false},
    {"response_headers", JSONBOID, "jsonb", false, false},
};
// The column behind each RowColumn of key_row.hpp (index 0 unused).
constexpr Column kRowColumnSource[] = {kStatus,       kStatus,        kFingerprint,    kResponse,
                                       kResponseCode, kRecoveryPoint, kLeaseToken,     kLockedUntil,
                                       kAttempts,     kTtl,           kCreatedAt,      kExpiresAt,
                                       kLease,        kResponseBody,  kResponseHeaders};
static_assert(sizeof kRowColumnSource / sizeof kRowColumnSource[0] ==
                  key_store::kRowResponseHeaders + 1,
              "one source column per RowColumn");

// Indexes the direct path keeps open for a write. Generous: a cancelled REINDEX CONCURRENTLY
// (which a database owner may run) leaves a copy of each index behind, and such leftovers must
// not push every claim onto the executor path.
constexpr int kMaxIndexes = 32;
constexpr int kMaxAttributes = 64;  // live and dropped columns of the table

// Why a write must go through the executor: the one list of what INSERT and UPDATE do
// beyond forming the row and adding its index entries, which the direct path does not do.
// needs_executor() returns the first that applies; anything not listed here is what the
// direct path does itself (privilege and read-only checks, unique checks of the primary
// key, entries in every plain B-Tree index, replica identity, serialization conflicts).
enum class ExecutorReason {
  kNone,
  kRequested,          // idempotency.executor_path (a superuser's switch, for tests)
  kNotHeapTable,       // a partition, another table access method, or too many columns
  kUserColumn,         // a column we do not know: its default and constraints
  kTypmod,             // a typmod (say timestamptz(0)) is a coercion
  kExtraNotNull,       // NOT NULL added to a column that may be NULL
  kDefault,            // a default on a column the claim's INSERT leaves out
  kIdentityGenerated,  // an identity or generated column
  kIndexKind,          // more indexes than kept, or one that is not a plain, immediate B-Tree
  kOtherUniqueIndex,   // a unique index besides the primary key (an arbiter, or a 23505)
  kTrigger,
  kRule,
  kRowSecurity,
  kCheckConstraint,
};

// What the direct path needs to know about the table, loaded once per backend and
// forgotten by the relcache callback whenever the table or one of its indexes changes
// (and by the syscache callback on pg_enum, for the labels).
struct Layout {
  Oid table = InvalidOid;          // InvalidOid: not loaded
  MemoryContext memory = nullptr;  // holds index_info
  Oid primary_key = InvalidOid;
  AttrNumber attnum[kColumnCount] = {};
  Oid processing_label = InvalidOid;
  Oid completed_label = InvalidOid;
  // Why writes need the executor whatever the call (kNone: they do not).
  ExecutorReason executor_reason = ExecutorReason::kNone;
  int index_count = 0;
  Oid index_oids[kMaxIndexes] = {};
  IndexInfo* index_info[kMaxIndexes] = {};
};
Layout layout;

// Counts relcache invalidations: one that arrives while a layout is being read (the first
// lock on an index processes pending messages) makes the reading start over, so a layout
// never misses an index created meanwhile.
uint64 invalidations = 0;

void forget_layout(Datum, Oid relation) {
  ++invalidations;
  if (relation == InvalidOid || relation == layout.table) layout.table = InvalidOid;
  for (int i = 0; i < layout.index_count; ++i)
    if (layout.index_oids[i] == relation) layout.table = InvalidOid;
}

// ALTER TYPE ... RENAME VALUE keeps a label's OID and changes its name: the cached OIDs of
// 'processing' and 'completed' must be looked up again (and refused if they are gone).
void forget_labels(Datum, SyscacheId, uint32) {
  ++invalidations;
  layout.table = InvalidOid;
}

// What makes the table unusable by this version (the executor path would misread it too).
enum class LayoutProblem { kNone, kMissingColumn, kColumnType, kLabel, kPrimaryKey, kOldVersion };
constexpr const char* kStatusLabels[] = {"processing", "completed"};
struct LayoutCheck {
  LayoutProblem problem = LayoutProblem::kNone;
  int column = 0;
};

// The key's identity since 1.2: (key, scope, owner), all compared bytewise. The key comes
// first so that descents compare mostly keys, read at a fixed offset; the owner is the
// role's name, so that a key names its role wherever its row moves.
bool is_our_primary_key(Relation index, const Layout& l) {
  const Form_pg_index form = index->rd_index;
  return form->indisprimary && form->indnkeyatts == 3 && form->indkey.values[0] == l.attnum[kKey] &&
         form->indkey.values[1] == l.attnum[kScope] && form->indkey.values[2] == l.attnum[kOwner] &&
         index->rd_indcollation[0] == C_COLLATION_OID &&
         index->rd_indcollation[1] == C_COLLATION_OID &&
         index->rd_indcollation[2] == C_COLLATION_OID;
}

// Fills `l` from the open table.
// pg-frame: runs inside pg_call only (owns no C++ object).
LayoutCheck read_layout(Relation table, Layout& l) {
  TupleDesc desc = RelationGetDescr(table);
  auto needs = [&](ExecutorReason reason) {
    if (l.executor_reason == ExecutorReason::kNone) l.executor_reason = reason;
  };
  if (table->rd_rel->relkind != RELKIND_RELATION || table->rd_rel->relam != HEAP_TABLE_AM_OID ||
      desc->natts > kMaxAttributes)
    needs(ExecutorReason::kNotHeapTable);
  for (int i = 0; i < desc->natts; ++i) {
    Form_pg_attribute attribute = TupleDescAttr(desc, i);
    if (attribute->attisdropped) continue;
    int column = 0;
    while (column < kColumnCount && strcmp(NameStr(attribute->attname), kColumns[column].name) != 0)
      ++column;
    if (column == kColumnCount) {
      needs(ExecutorReason::kUserColumn);
      continue;
    }
    l.attnum[column] = attribute->attnum;
    bool right_type = column == kStatus ? get_typtype(attribute->atttypid) == TYPTYPE_ENUM
                                        : attribute->atttypid == kColumns[column].type;
    // 1.0 and 1.1 stored the owner as a regrole (an OID, which names another role or none
    // after the row moves to another node or cluster).
    if (column == kOwner && attribute->atttypid == REGROLEOID)
      return {LayoutProblem::kOldVersion, column};
    if (!right_type) return {LayoutProblem::kColumnType, column};
    if (attribute->atttypmod != -1) needs(ExecutorReason::kTypmod);
    if (attribute->attnotnull && !kColumns[column].not_null) needs(ExecutorReason::kExtraNotNull);
    if (attribute->atthasdef && !kColumns[column].claim_writes) needs(ExecutorReason::kDefault);
    if (attribute->attidentity != '\0' || attribute->attgenerated != '\0')
      needs(ExecutorReason::kIdentityGenerated);
  }
  for (int column = 0; column < kColumnCount; ++column)
    if (l.attnum[column] == InvalidAttrNumber) return {LayoutProblem::kMissingColumn, column};
  Oid status_type = TupleDescAttr(desc, l.attnum[kStatus] - 1)->atttypid;
  Oid* label_oids[] = {&l.processing_label, &l.completed_label};
  for (int i = 0; i < 2; ++i) {
    *label_oids[i] =
        GetSysCacheOid2(ENUMTYPOIDNAME, Anum_pg_enum_oid, ObjectIdGetDatum(status_type),
                        CStringGetDatum(kStatusLabels[i]));
    if (!OidIsValid(*label_oids[i])) return {LayoutProblem::kLabel, i};
  }
  List* indexes = RelationGetIndexList(table);
  if (list_length(indexes) > kMaxIndexes) needs(ExecutorReason::kIndexKind);
  ListCell* cell = nullptr;
  foreach (cell, indexes) {
    Relation index = index_open(lfirst_oid(cell), AccessShareLock);
    if (is_our_primary_key(index, l)) l.primary_key = RelationGetRelid(index);
    if (l.index_count < kMaxIndexes) {
      MemoryContext old = MemoryContextSwitchTo(l.memory);
      IndexInfo* info = BuildIndexInfo(index);
      MemoryContextSwitchTo(old);
      // Only plain B-Tree indexes: other access methods keep per-index state across
      // inserts (ii_AmCache) that the executor cleans up and we would not.
      if (index->rd_rel->relam != BTREE_AM_OID || info->ii_Expressions != NIL ||
          info->ii_Predicate != NIL || info->ii_ExclusionOps != nullptr ||
          (index->rd_index->indisunique && !index->rd_index->indimmediate))
        needs(ExecutorReason::kIndexKind);
      // The direct path probes the primary key only; the executor would check every unique
      // index (and use one on the same columns as an arbiter). An invalid one (the leftover of
      // a cancelled CREATE INDEX or REINDEX CONCURRENTLY) is no arbiter for the executor
      // either: it gets its entries, with a plain unique check, when it is ready for inserts.
      if (index->rd_index->indisunique && index->rd_index->indisvalid &&
          !is_our_primary_key(index, l))
        needs(ExecutorReason::kOtherUniqueIndex);
      l.index_oids[l.index_count] = RelationGetRelid(index);
      l.index_info[l.index_count++] = info;
    }
    index_close(index, NoLock);
  }
  list_free(indexes);
  if (!OidIsValid(l.primary_key)) return {LayoutProblem::kPrimaryKey, 0};
  return {};
}

void load_layout(Relation table) {
  LayoutCheck check;
  for (uint64 seen = invalidations - 1; seen != invalidations;) {
    seen = invalidations;
    check = pg_call([&] {
      layout.table = InvalidOid;
      if (layout.memory == nullptr)
        layout.memory = AllocSetContextCreate(TopMemoryContext, "idempotency table layout",
                                              ALLOCSET_SMALL_SIZES);
      else
        MemoryContextReset(layout.memory);
      Layout loaded;
      loaded.memory = layout.memory;
      LayoutCheck result = read_layout(table, loaded);
      layout = loaded;
      return result;
    });
  }
  const std::string column = kColumns[check.column].name;
  switch (check.problem) {
    case LayoutProblem::kMissingColumn:
      throw Error(ERRCODE_UNDEFINED_COLUMN, "idempotency_keys lacks column \"" + column + "\"");
    case LayoutProblem::kColumnType:
      throw Error(ERRCODE_DATATYPE_MISMATCH, "column \"" + column +
                                                 "\" of idempotency_keys is not of type " +
                                                 kColumns[check.column].type_name);
    case LayoutProblem::kLabel:
      throw Error(ERRCODE_UNDEFINED_OBJECT,
                  std::string("key_status has no label \"") + kStatusLabels[check.column] + "\"");
    case LayoutProblem::kPrimaryKey:
      throw Error(ERRCODE_UNDEFINED_OBJECT,
                  "idempotency_keys lacks its primary key (key, scope, owner) with collation \"C\"",
                  {},
                  "A table made by an older version needs: ALTER EXTENSION idempotency UPDATE.");
    case LayoutProblem::kOldVersion:
      throw Error(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                  "idempotency_keys was made by idempotency 1.1 or older",
                  "This library needs the 1.2 table, whose owner column holds the role's name.",
                  "Run ALTER EXTENSION idempotency UPDATE in this database.");
    case LayoutProblem::kNone:
      break;
  }
  layout.table = RelationGetRelid(table);
}

// Per call (the relcache entry is current once the table is locked): the first reason of
// ExecutorReason that applies to this write, kNone when the direct path may write.
ExecutorReason needs_executor(Relation table) {
  if (gucs::executor_path) return ExecutorReason::kRequested;
  if (layout.executor_reason != ExecutorReason::kNone) return layout.executor_reason;
  if (table->rd_rel->relispartition) return ExecutorReason::kNotHeapTable;
  if (table->trigdesc != nullptr) return ExecutorReason::kTrigger;
  if (table->rd_rules != nullptr) return ExecutorReason::kRule;
  if (table->rd_rel->relrowsecurity) return ExecutorReason::kRowSecurity;
  const TupleConstr* constraints = table->rd_att->constr;
  if (constraints == nullptr) return ExecutorReason::kNone;
  if (constraints->num_check > 0) return ExecutorReason::kCheckConstraint;
  bool generated = constraints->has_generated_stored;
#if PG_VERSION_NUM >= 180000
  generated = generated || constraints->has_generated_virtual;
#endif
  return generated ? ExecutorReason::kIdentityGenerated : ExecutorReason::kNone;
}

// Looks up (owner, scope, key) in the primary key with `snapshot`, leaving the row in `slot`.
// pg-frame: runs inside pg_call only (owns no C++ object).
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

// Under REPEATABLE READ or SERIALIZABLE: the row in `slot` (found by a dirty snapshot) is
// another transaction's, and invisible to this transaction's snapshot.
// pg-frame: runs inside pg_call only (owns no C++ object).
bool serialization_conflict(Relation table, TupleTableSlot* slot) {
  if (!IsolationUsesXactSnapshot()) return false;
  bool should_free = false;
  HeapTuple tuple = ExecFetchSlotHeapTuple(slot, false, &should_free);
  TransactionId inserter = HeapTupleHeaderGetXmin(tuple->t_data);
  if (should_free) heap_freetuple(tuple);
  return !TransactionIdIsCurrentTransactionId(inserter) &&
         !table_tuple_satisfies_snapshot(table, slot, GetActiveSnapshot());
}

// The table and its indexes, open for one write.
struct Writer {
  Relation table = nullptr;
  int index_count = 0;
  Relation indexes[kMaxIndexes] = {};
};

// pg-frame: runs inside pg_call only (owns no C++ object).
void close_writer(Writer& writer) {
  for (int i = 0; i < writer.index_count; ++i) index_close(writer.indexes[i], NoLock);
  if (writer.table != nullptr) table_close(writer.table, NoLock);
  writer = Writer{};
}

// Opens the table for `command`; false when the executor must do the write (the table
// needs its machinery, or a privilege is missing: the executor then reports it). The
// indexes are opened by open_indexes, when the write needs them.
bool open_writer(Writer& writer, Oid table, AclMode privileges, const char* command) {
  pg_call([&] {
    PreventCommandIfReadOnly(command);
    PreventCommandIfParallelMode(command);
    writer.table = table_open(table, RowExclusiveLock);
  });
  if (layout.table != table) load_layout(writer.table);
  // Table work always runs as the extension owner (caller::ActingAsOwner), so GetUserId()
  // is that owner here: the check matters only if a superuser revoked the owner's own rights,
  // and then the executor reports the refusal.
  bool direct = pg_call([&] {
    return needs_executor(writer.table) == ExecutorReason::kNone &&
           pg_class_aclmask(table, GetUserId(), privileges, ACLMASK_ALL) == privileges;
  });
  if (!direct) pg_call([&] { close_writer(writer); });
  return direct;
}

// pg-frame: runs inside pg_call only (owns no C++ object).
void open_indexes(Writer& writer) {
  for (int i = writer.index_count; i < layout.index_count; ++i)
    writer.indexes[writer.index_count++] = index_open(layout.index_oids[i], RowExclusiveLock);
}

Relation primary_key_of(const Writer& writer) {
  for (int i = 0; i < writer.index_count; ++i)
    if (RelationGetRelid(writer.indexes[i]) == layout.primary_key) return writer.indexes[i];
  return nullptr;
}

// Adds the index entries of the heap tuple at `tid` (whose columns are values / nulls),
// as the executor would: unique indexes check uniqueness. For an update, `changed` has bit
// attnum - 1 set for each column that changed: an index over none of them gets the
// "unchanged" hint that lets B-Tree delete the older versions' entries bottom-up.
// `indexes` chooses the primary key only, every other index, or all of them; the primary
// key checks uniqueness with `primary_key_check`. Returns what the primary key's
// index_insert returned (true when it was not among `indexes`): with UNIQUE_CHECK_PARTIAL,
// false means another live version of the key may exist, and nothing waited for it.
enum class Indexes { kAll, kPrimaryKey, kOthers };
// pg-frame: runs inside pg_call only (owns no C++ object).
bool insert_index_entries(Writer& writer, Datum* values, bool* nulls, ItemPointer tid,
                          std::optional<uint64> changed, Indexes indexes = Indexes::kAll,
                          IndexUniqueCheck primary_key_check = UNIQUE_CHECK_YES) {
  bool unique = true;
  for (int i = 0; i < writer.index_count; ++i) {
    Relation index = writer.indexes[i];
    const bool is_primary_key = RelationGetRelid(index) == layout.primary_key;
    if ((indexes == Indexes::kPrimaryKey && !is_primary_key) ||
        (indexes == Indexes::kOthers && is_primary_key))
      continue;
    IndexInfo* info = layout.index_info[i];
    if (!index->rd_index->indisready) continue;  // being built concurrently
    Datum key_values[INDEX_MAX_KEYS];
    bool key_nulls[INDEX_MAX_KEYS];
    uint64 columns = 0;
    for (int k = 0; k < info->ii_NumIndexAttrs; ++k) {
      AttrNumber attnum = info->ii_IndexAttrNumbers[k];
      key_values[k] = values[attnum - 1];
      key_nulls[k] = nulls[attnum - 1];
      columns |= uint64{1} << (attnum - 1);
    }
    bool unchanged = changed && (columns & *changed) == 0;
    IndexUniqueCheck check = !index->rd_index->indisunique ? UNIQUE_CHECK_NO
                             : is_primary_key              ? primary_key_check
                                                           : UNIQUE_CHECK_YES;
    bool result =
        index_insert(index, key_values, key_nulls, tid, writer.table, check, unchanged, info);
    if (is_primary_key && check == UNIQUE_CHECK_PARTIAL) unique = result;
  }
  return unique;
}

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

// pg-frame: runs inside pg_call only (owns no C++ object).
bool same_text(Datum stored, const text* given) {
  struct varlena* value = pg_detoast_datum_packed(reinterpret_cast<struct varlena*>(stored));
  return VARSIZE_ANY_EXHDR(value) == VARSIZE_ANY_EXHDR(given) &&
         memcmp(VARDATA_ANY(value), VARDATA_ANY(given), VARSIZE_ANY_EXHDR(given)) == 0;
}

// A KeyRow from the columns of a row of the table, copied into `context`.
KeyRow decode_values(const Datum* values, const bool* nulls, MemoryContext context) {
  auto column = [&](int number, bool* is_null) {
    int index = layout.attnum[kRowColumnSource[number]] - 1;
    *is_null = nulls[index];
    return values[index];
  };
  bool is_null = false;
  return key_store::decode_columns(
      column, DatumGetObjectId(column(key_store::kRowStatus, &is_null)) == layout.completed_label,
      context);
}

}  // namespace

bool available() {
  // Citus can only be loaded with the server (shared_preload_libraries), before any call
  // here, so the answer holds for the backend's life: looked up once, not on every call.
  static const bool without_citus = !citus_guard::citus_loaded();
  return without_citus;
}

// The one place that decides, per call, whether the table is reached directly at all
// (reads and writes); the table's shape, and the superuser switch idempotency.executor_path,
// then decide the writes (needs_executor).
bool direct_path() {
  return available() && ExecutorCheckPerms_hook == nullptr && object_access_hook == nullptr;
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
  if (layout.table != table) load_layout(relation);
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
    *row = decode_values(slot->tts_values, slot->tts_isnull, context);
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

namespace {

// What a dirty snapshot finds in the primary key for (owner, scope, key).
enum class Found { kNothing, kRow, kOpenClaim };

// Probes with a dirty snapshot: committed versions and those of transactions still open.
// A version that another open transaction inserted is a claim in flight (kOpenClaim); any
// other live version (committed, this transaction's own, or one that an open transaction
// is deleting or updating) is a row for the caller to decide from again (kRow).
// pg-frame: runs inside pg_call only (owns no C++ object).
Found probe_dirty(Writer& writer, text* owner, text* scope, text* key) {
  TupleTableSlot* slot = table_slot_create(writer.table, nullptr);
  SnapshotData dirty;
  InitDirtySnapshot(dirty);
  bool exists = probe(writer.table, primary_key_of(writer), &dirty, owner, scope, key, slot);
  // The inserter of the version found, when its transaction is still open (never ours:
  // the dirty snapshot leaves xmin unset for this transaction's own versions).
  const bool open_insert = exists && TransactionIdIsValid(dirty.xmin);
  bool conflict = exists && !open_insert && serialization_conflict(writer.table, slot);
  ExecDropSingleTupleTableSlot(slot);
  if (conflict) raise_committed_after_snapshot(key);
  if (open_insert) return Found::kOpenClaim;
  return exists ? Found::kRow : Found::kNothing;
}

}  // namespace

InsertResult insert(Oid table, text* scope, text* key, const ClaimValues& claim,
                    key_store::RowAddress* where, bool known_absent) {
  Writer writer;
  if (!open_writer(writer, table, ACL_INSERT, "INSERT")) return InsertResult::kNeedsExecutor;
  // No per-key lock: the primary key is the arbiter (docs/design-batch.md, "Claims without
  // per-key locks"). A version of the key that a dirty snapshot sees answers at once; else
  // the row is inserted speculatively, as INSERT .. ON CONFLICT does, and the primary key's
  // entry added with a partial unique check, which never waits. Of concurrent inserters of
  // one key the first to add its entry wins: every later one finds that entry live, takes
  // its own tuple back (a super-delete, which makes it dead to everyone at once) and
  // answers from the winner's version.
  InsertResult result = pg_call([&] {
    open_indexes(writer);
    switch (known_absent ? Found::kNothing : probe_dirty(writer, claim.owner, scope, key)) {
      case Found::kOpenClaim:
        return InsertResult::kBusy;
      case Found::kRow:
        return InsertResult::kExists;
      case Found::kNothing:
        break;
    }

    Datum values[kMaxAttributes];
    bool nulls[kMaxAttributes];
    for (bool& null : nulls) null = true;
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
    HeapTuple tuple = heap_form_tuple(RelationGetDescr(writer.table), values, nulls);
    // The speculative-insertion lock is held only between the insert and its confirmation
    // or super-delete (one lock-manager entry at a time, never one per claim kept): whoever
    // meets the tuple meanwhile waits on it (SpeculativeInsertionWait), not on this
    // transaction.
    const TransactionId xid = GetCurrentTransactionId();
    const uint32 token = SpeculativeInsertionLockAcquire(xid);
    HeapTupleHeaderSetSpeculativeToken(tuple->t_data, token);
    heap_insert(writer.table, tuple, GetCurrentCommandId(true), HEAP_INSERT_SPECULATIVE, nullptr);
    if (!insert_index_entries(writer, values, nulls, &tuple->t_self, std::nullopt,
                              Indexes::kPrimaryKey, UNIQUE_CHECK_PARTIAL)) {
      // Another version of the key got its entry in first: take ours back and answer from
      // theirs (an open claim: in_progress; else the caller decides again).
      heap_abort_speculative(writer.table, &tuple->t_self);
      SpeculativeInsertionLockRelease(xid);
      heap_freetuple(tuple);
      return probe_dirty(writer, claim.owner, scope, key) == Found::kOpenClaim
                 ? InsertResult::kBusy
                 : InsertResult::kExists;
    }
    insert_index_entries(writer, values, nulls, &tuple->t_self, std::nullopt, Indexes::kOthers);
    heap_finish_speculative(writer.table, &tuple->t_self);
    SpeculativeInsertionLockRelease(xid);
    *where = {tuple->t_self, file_of(writer.table)};
    heap_freetuple(tuple);
    // Later statements of this call (a completion in the same SQL statement) see the row.
    CommandCounterIncrement();
    return InsertResult::kInserted;
  });
  pg_call([&] { close_writer(writer); });
  return result;
}

std::optional<KeyRow> complete(Oid table, const key_store::RowAddress& where, text* scope,
                               text* key, const pg_uuid_t& token, text* owner,
                               const Outcome& outcome, TimestampTz now, TimestampTz expires_at,
                               MemoryContext context) {
  Writer writer;
  if (!open_writer(writer, table, ACL_UPDATE | ACL_SELECT, "UPDATE")) return std::nullopt;
  // The new row's columns; varlenas point into the new tuple (palloc'd, so they stay).
  Datum values[kMaxAttributes];
  bool nulls[kMaxAttributes];
  bool updated = pg_call([&] {
    CheckCmdReplicaIdentity(writer.table, CMD_UPDATE);
    TupleDesc desc = RelationGetDescr(writer.table);
    if (where.file != file_of(writer.table)) return false;  // truncated or rewritten since
    // A TRUNCATE of a file created in this same transaction (by an earlier TRUNCATE, a
    // CLUSTER or CREATE EXTENSION) empties that file in place: the TID may point past its end.
    if (file_is_new(writer.table) &&
        ItemPointerGetBlockNumber(&where.tid) >= RelationGetNumberOfBlocks(writer.table))
      return false;
    HeapTupleData old;
    old.t_self = where.tid;
    Buffer buffer = InvalidBuffer;
    // SnapshotSelf: the version this transaction sees now; an updated or deleted one is not.
    if (!heap_fetch(writer.table, SnapshotSelf, &old, &buffer, false)) return false;
    heap_deform_tuple(&old, desc, values, nulls);
    auto at = [](Column column) { return layout.attnum[column] - 1; };
    bool holds = !nulls[at(kLeaseToken)] &&
                 memcmp(DatumGetUUIDP(values[at(kLeaseToken)])->data, token.data, UUID_LEN) == 0 &&
                 same_text(values[at(kOwner)], owner) &&
                 DatumGetObjectId(values[at(kStatus)]) == layout.processing_label &&
                 DatumGetTimestampTz(values[at(kExpiresAt)]) > now &&
                 same_text(values[at(kScope)], scope) && same_text(values[at(kKey)], key);
    if (!holds) {
      ReleaseBuffer(buffer);
      return false;
    }
    uint64 changed = 0;
    for (Column column :
         {kStatus, kResponseCode, kUpdatedAt, kResponse, kResponseBody, kResponseHeaders})
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
    // The pin kept the old tuple's bytes in place until they are copied here.
    HeapTuple tuple = heap_form_tuple(desc, values, nulls);
    ReleaseBuffer(buffer);
    // The direct path has only B-Tree indexes, none summarizing: all or none get entries.
#if PG_VERSION_NUM >= 160000
    TU_UpdateIndexes update_indexes = TU_All;
    simple_heap_update(writer.table, &old.t_self, tuple, &update_indexes);
    bool new_entries = update_indexes != TU_None;
#else
    simple_heap_update(writer.table, &old.t_self, tuple);
    bool new_entries = !HeapTupleIsHeapOnly(tuple);
#endif
    heap_deform_tuple(tuple, desc, values, nulls);
    if (new_entries) {
      // A HOT update needs no index entry; this transaction's insert of the row already
      // holds the indexes' locks.
      open_indexes(writer);
      insert_index_entries(writer, values, nulls, &tuple->t_self, changed);
    }
    CommandCounterIncrement();
    return true;
  });
  std::optional<KeyRow> row;
  if (updated) row = decode_values(values, nulls, context);
  pg_call([&] { close_writer(writer); });
  return row;
}

void on_load() {
  CacheRegisterRelcacheCallback(forget_layout, 0);
  CacheRegisterSyscacheCallback(ENUMOID, forget_labels, 0);
}

}  // namespace idem::key_heap
