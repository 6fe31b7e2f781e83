// The key table's layout, as the direct path uses it (key_layout.hpp).
#include "key_layout.hpp"

#include "pg/storage.hpp"

namespace idem::key_layout {
namespace {

using namespace key_store;  // NOLINT(google-build-using-namespace): the column names

Layout layout;

// Counts relcache invalidations: one that arrives while a layout is being read (the first
// lock on an index processes pending messages) makes the reading start over, so a layout
// never misses an index created meanwhile.
uint64 invalidations = 0;

// The BRIN insert states (see key_layout.hpp): where they live, and whether any is kept.
MemoryContext insert_states = nullptr;
bool states_kept = false;

// Releases every kept insert state: on 17+ the range map's pins, taken under the top
// resource owner (which must be current to release them), then their memory.
// pg-frame: runs inside pg::storage::read_layout's pg_call or a callback only (owns no C++
// object).
void release_insert_states() {
  if (!states_kept) return;
  states_kept = false;
  ResourceOwner saved = CurrentResourceOwner;
  CurrentResourceOwner = TopTransactionResourceOwner;
  for (int i = 0; i < layout.index_count; ++i) {
    IndexInfo* info = layout.index_info[i];
    if (info == nullptr || info->ii_AmCache == nullptr) continue;
#if PG_VERSION_NUM >= 170000
    // (It reads only `info`: the index relation is not needed, nor open here.)
    brininsertcleanup(nullptr, info);
#endif
    info->ii_AmCache = nullptr;
  }
  CurrentResourceOwner = saved;
  MemoryContextReset(insert_states);
}

// Before the resource owner looks for leaked pins at the transaction's end.
// pg-frame: a transaction callback, called by PostgreSQL (owns no C++ object).
void release_at_transaction_end(XactEvent event, void*) {
  if (event == XACT_EVENT_PRE_COMMIT || event == XACT_EVENT_PARALLEL_PRE_COMMIT ||
      event == XACT_EVENT_PRE_PREPARE || event == XACT_EVENT_ABORT ||
      event == XACT_EVENT_PARALLEL_ABORT)
    release_insert_states();
}

// pg-frame: a relcache invalidation callback, called by PostgreSQL (owns no C++ object).
void forget_layout(Datum, Oid relation) {
  ++invalidations;
  release_insert_states();
  if (relation == InvalidOid || relation == layout.table) layout.table = InvalidOid;
  for (int i = 0; i < layout.index_count; ++i)
    if (layout.index_oids[i] == relation) layout.table = InvalidOid;
}

// ALTER TYPE ... RENAME VALUE keeps a label's OID and changes its name: the cached OIDs of
// 'processing' and 'completed' must be looked up again (and refused if they are gone).
// pg-frame: a syscache invalidation callback, called by PostgreSQL (owns no C++ object).
void forget_labels(Datum, SyscacheId, uint32) {
  ++invalidations;
  release_insert_states();
  layout.table = InvalidOid;
}

constexpr const char* kStatusLabels[] = {"processing", "completed"};

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

// Is `info` an index over expiry_bucket(expires_at), and nothing else?
// pg-frame: runs inside pg::storage::read_layout only (owns no C++ object).
bool is_expiry_bucket_index(const IndexInfo* info, const Layout& l) {
  return info->ii_NumIndexAttrs == 1 && info->ii_IndexAttrNumbers[0] == 0 &&
         is_expiry_bucket_key(info->ii_Expressions, l.attnum[kExpiresAt]);
}

// The first reason that applies is the one a layout keeps.
void needs(Layout& l, route::ExecutorReason reason) {
  if (l.executor_reason == route::ExecutorReason::kNone) l.executor_reason = reason;
}

// Finds each of our columns in the table's descriptor, checking its type; a column the
// direct path cannot write as the executor would sends writes to the executor.
// pg-frame: runs inside pg::storage::read_layout only (owns no C++ object).
LayoutCheck read_columns(TupleDesc desc, Layout& l) {
  for (int i = 0; i < desc->natts; ++i) {
    Form_pg_attribute attribute = TupleDescAttr(desc, i);
    if (attribute->attisdropped) continue;
    int column = 0;
    while (column < kColumnCount && strcmp(NameStr(attribute->attname), kColumns[column].name) != 0)
      ++column;
    if (column == kColumnCount) {
      needs(l, route::ExecutorReason::kUserColumn);
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
    if (attribute->atttypmod != -1) needs(l, route::ExecutorReason::kTypmod);
    if (attribute->attnotnull && !kColumns[column].not_null)
      needs(l, route::ExecutorReason::kExtraNotNull);
    if (attribute->atthasdef && !kColumns[column].claim_writes)
      needs(l, route::ExecutorReason::kDefault);
    if (attribute->attidentity != '\0' || attribute->attgenerated != '\0')
      needs(l, route::ExecutorReason::kIdentityGenerated);
  }
  for (int column = 0; column < kColumnCount; ++column)
    if (l.attnum[column] == InvalidAttrNumber)
      // The owner's stamp came with 1.3: a 1.2 table, not a damaged one.
      return {column == kOwnerOid || column == kOwnerSystem ? LayoutProblem::kOldVersion
                                                            : LayoutProblem::kMissingColumn,
              column};
  return {};
}

// Finds the primary key and the indexes a direct write maintains; an index the direct path
// cannot maintain as the executor would sends writes to the executor.
// pg-frame: runs inside pg::storage::read_layout only (owns no C++ object).
LayoutCheck read_indexes(Relation table, Layout& l) {
  List* indexes = RelationGetIndexList(table);
  if (list_length(indexes) > kMaxIndexes) needs(l, route::ExecutorReason::kIndexKind);
  ListCell* cell = nullptr;
  foreach (cell, indexes) {
    Relation index = index_open(lfirst_oid(cell), AccessShareLock);
    if (is_our_primary_key(index, l)) l.primary_key = RelationGetRelid(index);
    if (l.index_count < kMaxIndexes) {
      MemoryContext old = MemoryContextSwitchTo(l.memory);
      IndexInfo* info = BuildIndexInfo(index);
      MemoryContextSwitchTo(old);
      // Plain B-Tree and BRIN indexes only: other access methods keep per-index state across
      // inserts (ii_AmCache) that the executor cleans up; key_heap_write.cpp does it for BRIN.
      // Of expressions, only expiry_bucket(expires_at), which key_heap_write.cpp computes.
      l.on_expiry_bucket[l.index_count] = is_expiry_bucket_index(info, l);
      if ((index->rd_rel->relam != BTREE_AM_OID && index->rd_rel->relam != BRIN_AM_OID) ||
          (info->ii_Expressions != NIL && !l.on_expiry_bucket[l.index_count]) ||
          info->ii_Predicate != NIL || info->ii_ExclusionOps != nullptr ||
          (index->rd_index->indisunique && !index->rd_index->indimmediate))
        needs(l, route::ExecutorReason::kIndexKind);
      // The direct path probes the primary key only; the executor would check every unique
      // index (and use one on the same columns as an arbiter). An invalid one (the leftover of
      // a cancelled CREATE INDEX or REINDEX CONCURRENTLY) is no arbiter for the executor
      // either: it gets its entries, with a plain unique check, when it is ready for inserts.
      if (index->rd_index->indisunique && index->rd_index->indisvalid &&
          !is_our_primary_key(index, l))
        needs(l, route::ExecutorReason::kOtherUniqueIndex);
      l.index_oids[l.index_count] = RelationGetRelid(index);
      l.index_info[l.index_count++] = info;
    }
    index_close(index, NoLock);
  }
  list_free(indexes);
  if (!OidIsValid(l.primary_key)) return {LayoutProblem::kPrimaryKey, 0};
  return {};
}

// Fills `l` from the open table.
// pg-frame: runs inside pg::storage::read_layout only (owns no C++ object).
LayoutCheck read_layout(Relation table, Layout& l) {
  TupleDesc desc = RelationGetDescr(table);
  if (table->rd_rel->relkind != RELKIND_RELATION || table->rd_rel->relam != HEAP_TABLE_AM_OID ||
      desc->natts > kMaxAttributes)
    needs(l, route::ExecutorReason::kNotHeapTable);
  if (LayoutCheck check = read_columns(desc, l); check.problem != LayoutProblem::kNone)
    return check;
  Oid status_type = TupleDescAttr(desc, l.attnum[kStatus] - 1)->atttypid;
  Oid* label_oids[] = {&l.processing_label, &l.completed_label};
  for (int i = 0; i < 2; ++i) {
    *label_oids[i] =
        GetSysCacheOid2(ENUMTYPOIDNAME, Anum_pg_enum_oid, ObjectIdGetDatum(status_type),
                        CStringGetDatum(kStatusLabels[i]));
    if (!OidIsValid(*label_oids[i])) return {LayoutProblem::kLabel, i};
  }
  return read_indexes(table, l);
}

}  // namespace

// pg-frame: runs inside pg::storage::read_layout only (owns no C++ object).
LayoutCheck read_into_cache(Relation table) {
  release_insert_states();
  layout.table = InvalidOid;
  if (layout.memory == nullptr)
    layout.memory =
        AllocSetContextCreate(TopMemoryContext, "idempotency table layout", ALLOCSET_SMALL_SIZES);
  else
    MemoryContextReset(layout.memory);
  Layout loaded;
  loaded.memory = layout.memory;
  LayoutCheck result = read_layout(table, loaded);
  layout = loaded;
  return result;
}

namespace {

void load_layout(Relation table) {
  LayoutCheck check;
  for (uint64 seen = invalidations - 1; seen != invalidations;) {
    seen = invalidations;
    check = pg::storage::read_layout(table);
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
      if (check.column == kOwner) reject_old_table();
      reject_unstamped_table();
    case LayoutProblem::kNone:
      break;
  }
  layout.table = RelationGetRelid(table);
}

}  // namespace

void reject_old_table() {
  throw Error(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
              "idempotency_keys was made by idempotency 1.1 or older",
              "This library needs the 1.3 table, whose owner column holds the role's name.",
              "Run ALTER EXTENSION idempotency UPDATE in this database.");
}

void reject_unstamped_table() {
  throw Error(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
              "idempotency_keys was made by idempotency 1.2",
              "This library needs the 1.3 table, whose rows carry their owner's OID and cluster.",
              "Run ALTER EXTENSION idempotency UPDATE in this database.");
}

const Layout& of(Relation table) {
  if (layout.table != RelationGetRelid(table)) load_layout(table);
  return layout;
}

const Layout& current() {
  return layout;
}

namespace {
Datum sql_expiry_bucket(FunctionCallInfo fcinfo) {
  PG_RETURN_TIMESTAMPTZ(expiry_bucket(PG_GETARG_TIMESTAMPTZ(0)));
}
}  // namespace

// A KeyRow from the columns of a row of the table, copied into `context`.
key_store::KeyRow decode_values(const Datum* values, const bool* nulls, MemoryContext context) {
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

// pg-frame: runs inside a pg_call of src/pg/ only (owns no C++ object).
MemoryContext insert_states_context() {
  if (insert_states == nullptr)
    insert_states = AllocSetContextCreate(TopMemoryContext, "idempotency BRIN insert states",
                                          ALLOCSET_SMALL_SIZES);
  return insert_states;
}

void insert_states_kept() {
  states_kept = true;
}

void on_load() {
  RegisterXactCallback(release_at_transaction_end, nullptr);
  CacheRegisterRelcacheCallback(forget_layout, 0);
  CacheRegisterSyscacheCallback(ENUMOID, forget_labels, 0);
}

}  // namespace idem::key_layout

IDEM_SQL_FUNCTION(expiry_bucket, idem::key_layout::sql_expiry_bucket)

namespace idem::key_layout {

// pg-frame: runs inside pg::storage::read_layout or a pg_call of the cleanup only (owns no
// C++ object): fmgr_info raises for a function gone.
bool is_expiry_bucket_key(const List* expressions, AttrNumber expires_at) {
  if (list_length(expressions) != 1 || !IsA(linitial(expressions), FuncExpr)) return false;
  const FuncExpr* call = castNode(FuncExpr, linitial(expressions));
  if (list_length(call->args) != 1 || !IsA(linitial(call->args), Var) ||
      castNode(Var, linitial(call->args))->varattno != expires_at ||
      call->funcresulttype != TIMESTAMPTZOID)
    return false;
  FmgrInfo function;
  fmgr_info(call->funcid, &function);
  return function.fn_addr == &::expiry_bucket;
}

}  // namespace idem::key_layout
