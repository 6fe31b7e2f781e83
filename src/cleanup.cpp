// idempotency_cleanup() and the batch statement it shares with the worker (cleanup.hpp).
#include "cleanup.hpp"

#include "caller.hpp"
#include "gucs.hpp"
#include "key_store.hpp"
#include "pg_boundary.hpp"
#include "stats.hpp"

namespace idem::cleanup {
namespace {

// $1 now, $2 batch size, $3 lower bound of expires_at. The inner SELECT walks the
// expires_at index in order and locks rows without waiting (SKIP LOCKED: a claim holding a
// row is never blocked, and never loses its row); the DELETE then reaches the locked rows
// by their ctid (a TID scan) and checks the expiry once more.
std::string batch_sql(const std::string& table) {
  return "WITH gone AS (DELETE FROM " + table +
         " WHERE ctid OPERATOR(pg_catalog.=) ANY (ARRAY("
         "SELECT ctid FROM " +
         table +
         " WHERE expires_at OPERATOR(pg_catalog.>=) $3"
         " AND expires_at OPERATOR(pg_catalog.<=) $1"
         " ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED))"
         " AND expires_at OPERATOR(pg_catalog.<=) $1 RETURNING expires_at)"
         " SELECT pg_catalog.count(*), pg_catalog.max(expires_at) FROM gone";
}

// Up to $1 keys whose owner names no role (dropped or renamed), locked without waiting and
// deleted. The owner is the role's name (1.2), compared with pg_authid.rolname.
std::string orphans_sql(const std::string& table) {
  const std::string orphan =
      " NOT EXISTS (SELECT FROM pg_catalog.pg_authid a"
      " WHERE a.rolname OPERATOR(pg_catalog.=) k.owner)";
  return "WITH gone AS (DELETE FROM " + table +
         " k WHERE ctid OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT ctid FROM " + table + " k WHERE" +
         orphan + " LIMIT $1 FOR UPDATE SKIP LOCKED)) AND" + orphan +
         " RETURNING 1) SELECT pg_catalog.count(*) FROM gone";
}

enum PlanId { kBatch, kOrphans, kPlanCount };

// Plans kept per backend for the table they were made for (a new table OID after DROP and
// CREATE EXTENSION makes them stale).
struct PlanCache {
  Oid table = InvalidOid;
  std::array<SPIPlanPtr, kPlanCount> plans{};
};
PlanCache cache;

SPIPlanPtr plan_for(Oid table, PlanId id) {
  if (cache.table != table) {
    for (SPIPlanPtr& old : cache.plans) {
      SPIPlanPtr freed = std::exchange(old, nullptr);
      if (freed != nullptr) pg_call([&] { SPI_freeplan(freed); });
    }
    cache.table = table;
  }
  if (cache.plans[id] != nullptr) return cache.plans[id];
  const std::string name = key_store::qualified_name(table);
  std::string sql;
  std::vector<Oid> types;
  switch (id) {
    case kBatch:
      sql = batch_sql(name);
      types = {TIMESTAMPTZOID, INT4OID, TIMESTAMPTZOID};
      break;
    default:
      sql = orphans_sql(name);
      types = {INT4OID};
      break;
  }
  SPIPlanPtr plan = pg_call([&] {
    // Generic from the start: the shape (an index scan under a LIMIT) is the right one
    // whatever the values, and custom plans would be re-planned every batch.
    return SPI_prepare_cursor(sql.c_str(), static_cast<int>(types.size()), types.data(),
                              CURSOR_OPT_GENERIC_PLAN);
  });
  if (plan == nullptr)
    throw Error(ERRCODE_INTERNAL_ERROR, "could not prepare a cleanup statement",
                SPI_result_code_string(SPI_result));
  pg_call([&] { SPI_keepplan(plan); });
  cache.plans[id] = plan;
  return plan;
}

// Runs a kept plan that returns one row; checks the row's column types before they are read.
HeapTuple run_one_row(Oid table, PlanId id, Datum* values, std::initializer_list<Oid> types,
                      bool may_be_empty = false) {
  SPIPlanPtr plan = plan_for(table, id);
  int rc = pg_call([&] { return SPI_execute_plan(plan, values, nullptr, false, 0); });
  if (rc != SPI_OK_SELECT || SPI_processed > 1 || (SPI_processed == 0 && !may_be_empty))
    throw Error(ERRCODE_INTERNAL_ERROR, "a cleanup statement failed", SPI_result_code_string(rc));
  TupleDesc desc = SPI_tuptable->tupdesc;
  bool shaped = desc->natts == static_cast<int>(types.size());
  int column = 0;
  for (Oid type : types) shaped = shaped && TupleDescAttr(desc, column++)->atttypid == type;
  if (!shaped)
    throw Error(ERRCODE_DATATYPE_MISMATCH, "a cleanup statement returned unexpected columns");
  return SPI_processed == 0 ? nullptr : SPI_tuptable->vals[0];
}

// Under Citus, a distributed idempotency_keys is an empty shell: its rows live in shard
// tables (idempotency_keys_<shardid>, same schema, same owner), and the node that holds a
// shard's placement is where every call for its keys runs (the functions are delegated).
// So each node cleans its own placements, with node-local role OIDs, and no node touches
// the shell. Returns the relations that hold keys on this node. Needs an open SPI connection.
std::vector<Oid> key_relations(Oid table) {
  const bool citus = pg_call(
      [] { return OidIsValid(get_relname_relid("pg_dist_partition", PG_CATALOG_NAMESPACE)); });
  if (!citus) return {table};
  Oid types[] = {REGCLASSOID};
  Datum values[] = {ObjectIdGetDatum(table)};
  int rc = pg_call([&] {
    return SPI_execute_with_args(
        "SELECT s.shardid FROM pg_catalog.pg_dist_partition d"
        " LEFT JOIN pg_catalog.pg_dist_shard s ON s.logicalrelid OPERATOR(pg_catalog.=) "
        "d.logicalrelid"
        " AND EXISTS (SELECT FROM pg_catalog.pg_dist_placement p"
        " WHERE p.shardid OPERATOR(pg_catalog.=) s.shardid AND p.groupid OPERATOR(pg_catalog.=)"
        " (SELECT groupid FROM pg_catalog.pg_dist_local_group))"
        " WHERE d.logicalrelid OPERATOR(pg_catalog.=) $1",
        1, types, values, nullptr, true, 0);
  });
  if (rc != SPI_OK_SELECT)
    throw Error(ERRCODE_INTERNAL_ERROR, "could not read Citus' shard placements",
                SPI_result_code_string(rc));
  if (SPI_processed == 0) return {table};  // not distributed: an ordinary table
  if (SPI_tuptable->tupdesc->natts != 1 ||
      TupleDescAttr(SPI_tuptable->tupdesc, 0)->atttypid != INT8OID)
    throw Error(ERRCODE_DATATYPE_MISMATCH, "pg_dist_shard.shardid is not bigint");
  std::vector<int64> shards;
  for (uint64 i = 0; i < SPI_processed; ++i) {
    bool is_null = false;
    Datum shard = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1, &is_null);
    if (!is_null) shards.push_back(DatumGetInt64(shard));
  }
  std::vector<Oid> relations;
  for (int64 shard : shards) {
    const std::string name = "idempotency_keys_" + std::to_string(shard);
    Oid relation = pg_call([&] {
      Oid found = get_relname_relid(name.c_str(), get_rel_namespace(table));
      // A placement of ours is created by Citus as the owner of the distributed table.
      HeapTuple tuple =
          OidIsValid(found) ? SearchSysCache1(RELOID, ObjectIdGetDatum(found)) : nullptr;
      bool trusted = false;
      if (HeapTupleIsValid(tuple)) {
        trusted = superuser_arg(reinterpret_cast<Form_pg_class>(GETSTRUCT(tuple))->relowner);
        ReleaseSysCache(tuple);
      }
      return trusted ? found : InvalidOid;
    });
    if (!OidIsValid(relation))
      throw Error(ERRCODE_INSUFFICIENT_PRIVILEGE,
                  "shard " + name + " of idempotency_keys is missing or not owned by a superuser");
    relations.push_back(relation);
  }
  return relations;
}

// One batch in one relation (the table, or one shard of it).
Batch delete_batch_in(Oid table, TimestampTz now, TimestampTz from, int batch_size) {
  Datum values[] = {TimestampTzGetDatum(now), Int32GetDatum(batch_size), TimestampTzGetDatum(from)};
  HeapTuple tuple = run_one_row(table, kBatch, values, {INT8OID, TIMESTAMPTZOID});
  Batch batch;
  bool is_null = false;
  TupleDesc desc = SPI_tuptable->tupdesc;
  batch.deleted = static_cast<uint64>(DatumGetInt64(SPI_getbinval(tuple, desc, 1, &is_null)));
  Datum last = SPI_getbinval(tuple, desc, 2, &is_null);
  batch.last_expiry = is_null ? from : DatumGetTimestampTz(last);
  return batch;
}

// Up to batch_size keys of dropped roles in one relation.
uint64 delete_orphans_in(Oid table, int batch_size) {
  Datum values[] = {Int32GetDatum(batch_size)};
  HeapTuple tuple = run_one_row(table, kOrphans, values, {INT8OID});
  bool is_null = false;
  return static_cast<uint64>(
      DatumGetInt64(SPI_getbinval(tuple, SPI_tuptable->tupdesc, 1, &is_null)));
}

}  // namespace

Batch delete_batch(Oid table, TimestampTz now, TimestampTz from, int batch_size) {
  const std::vector<Oid> relations = key_relations(table);
  const bool sharded = !(relations.size() == 1 && relations[0] == table);
  Batch batch;
  batch.last_expiry = from;
  for (Oid relation : relations) {
    // Shards start from the beginning of their index each time: `from` is the table's.
    Batch one = delete_batch_in(relation, now, sharded ? DT_NOBEGIN : from, batch_size);
    batch.deleted += one.deleted;
    batch.full = batch.full || one.deleted >= static_cast<uint64>(batch_size);
    if (!sharded) batch.last_expiry = one.last_expiry;
  }
  // Counted batch by batch, so that the view shows a long round's progress.
  stats::count(stats::kExpiredDeleted, batch.deleted);
  return batch;
}

Batch delete_orphans(Oid table, int batch_size) {
  Batch batch;
  for (Oid relation : key_relations(table)) {
    uint64 deleted = delete_orphans_in(relation, batch_size);
    batch.deleted += deleted;
    batch.full = batch.full || deleted >= static_cast<uint64>(batch_size);
  }
  stats::count(stats::kExpiredDeleted, batch.deleted);
  return batch;
}

namespace {

// idempotency_cleanup(batch_size): deletes every key expired at the time of the call.
//
// A function runs inside its caller's transaction and cannot commit: each batch is its own
// statement (its own snapshot, at most batch_size row locks taken at a time, SKIP LOCKED),
// but the deletions commit together with the caller. The worker commits every batch; from
// pg_cron, run it often enough that one call has little to do.
Datum sql_cleanup(FunctionCallInfo fcinfo) {
  (void)caller::calling_role("idempotency_cleanup");
  int batch_size = PG_ARGISNULL(0) ? gucs::cleanup_batch_size : PG_GETARG_INT32(0);
  if (batch_size <= 0)
    throw Error(ERRCODE_INVALID_PARAMETER_VALUE, "batch_size must be positive",
                "batch_size is " + std::to_string(batch_size) + ".",
                "Pass NULL to use idempotency.cleanup_batch_size.");
  const caller::Installation installation = caller::of_function(fcinfo->flinfo->fn_oid);
  const Oid table = installation.table;
  const TimestampTz now = GetCurrentTimestamp();
  uint64 total = 0;
  try {
    caller::ActingAsOwner acting(installation);
    int rc = pg_call([] { return SPI_connect(); });
    if (rc != SPI_OK_CONNECT) throw Error(ERRCODE_INTERNAL_ERROR, "SPI_connect failed");
    // Keys of dropped roles first, then the expired ones.
    Batch orphans;
    do {
      orphans = delete_orphans(table, batch_size);
      total += orphans.deleted;
      pg_call([] { CHECK_FOR_INTERRUPTS(); });
    } while (orphans.full);
    Batch batch;
    do {
      batch = delete_batch(table, now, batch.last_expiry, batch_size);
      total += batch.deleted;
      pg_call([] { CHECK_FOR_INTERRUPTS(); });
    } while (batch.full);
    pg_call([] { SPI_finish(); });
  } catch (const PgError& e) {
    // Shared memory is not transactional: the failure stays visible in idempotency_stats.
    stats::record_cleanup(MyDatabaseId, total, e.what());
    throw;
  } catch (const Error& e) {
    stats::record_cleanup(MyDatabaseId, total, e.what());
    throw;
  }
  stats::record_cleanup(MyDatabaseId, total, nullptr);
  return Int64GetDatum(static_cast<int64>(total));
}

}  // namespace
}  // namespace idem::cleanup

IDEM_SQL_FUNCTION(idempotency_cleanup, idem::cleanup::sql_cleanup)
