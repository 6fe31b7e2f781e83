// idempotency_cleanup() and the batch statement it shares with the worker (cleanup.hpp).
#include "cleanup.hpp"

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

// One plan per backend, for the table it was made for (a new table OID after DROP and
// CREATE EXTENSION makes it stale).
struct PlanCache {
  Oid table = InvalidOid;
  SPIPlanPtr plan = nullptr;
};
PlanCache cache;

SPIPlanPtr plan_for(Oid table) {
  if (cache.table == table && cache.plan != nullptr) return cache.plan;
  if (cache.plan != nullptr) {
    SPIPlanPtr old = cache.plan;
    cache.plan = nullptr;
    cache.table = InvalidOid;
    pg_call([&] { SPI_freeplan(old); });
  }
  const std::string sql = batch_sql(key_store::qualified_name(table));
  Oid types[] = {TIMESTAMPTZOID, INT4OID, TIMESTAMPTZOID};
  SPIPlanPtr plan = pg_call([&] {
    // Generic from the start: the shape (index scan in expires_at order under a LIMIT) is
    // the right one whatever the values, and custom plans would be re-planned every batch.
    return SPI_prepare_cursor(sql.c_str(), 3, types, CURSOR_OPT_GENERIC_PLAN);
  });
  if (plan == nullptr)
    throw Error(ERRCODE_INTERNAL_ERROR, "could not prepare the cleanup statement",
                SPI_result_code_string(SPI_result));
  pg_call([&] { SPI_keepplan(plan); });
  cache.plan = plan;
  cache.table = table;
  return plan;
}

}  // namespace

Batch delete_batch(Oid table, TimestampTz now, TimestampTz from, int batch_size) {
  SPIPlanPtr plan = plan_for(table);
  Datum values[] = {TimestampTzGetDatum(now), Int32GetDatum(batch_size), TimestampTzGetDatum(from)};
  int rc = pg_call([&] { return SPI_execute_plan(plan, values, nullptr, false, 0); });
  if (rc != SPI_OK_SELECT || SPI_processed != 1)
    throw Error(ERRCODE_INTERNAL_ERROR, "the cleanup statement failed", SPI_result_code_string(rc));
  Batch batch;
  bool is_null = false;
  HeapTuple tuple = SPI_tuptable->vals[0];
  TupleDesc desc = SPI_tuptable->tupdesc;
  batch.deleted = static_cast<uint64>(DatumGetInt64(SPI_getbinval(tuple, desc, 1, &is_null)));
  Datum last = SPI_getbinval(tuple, desc, 2, &is_null);
  batch.last_expiry = is_null ? from : DatumGetTimestampTz(last);
  // Counted batch by batch, so that the view shows a long round's progress.
  stats::count(stats::kExpiredDeleted, batch.deleted);
  return batch;
}

Oid installed_table() {
  int rc = pg_call([] {
    return SPI_execute(
        "SELECT c.oid FROM pg_catalog.pg_extension e JOIN pg_catalog.pg_class c"
        " ON c.relnamespace OPERATOR(pg_catalog.=) e.extnamespace"
        " AND c.relname OPERATOR(pg_catalog.=) 'idempotency_keys'"
        " AND c.relkind OPERATOR(pg_catalog.=) 'r'"
        " WHERE e.extname OPERATOR(pg_catalog.=) 'idempotency'",
        true, 1);
  });
  if (rc != SPI_OK_SELECT)
    throw Error(ERRCODE_INTERNAL_ERROR, "could not look up the extension idempotency",
                SPI_result_code_string(rc));
  if (SPI_processed == 0) return InvalidOid;
  bool is_null = false;
  return DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &is_null));
}

namespace {

// idempotency_cleanup(batch_size): deletes every key expired at the time of the call.
//
// A function runs inside its caller's transaction and cannot commit: each batch is its own
// statement (its own snapshot, at most batch_size row locks taken at a time, SKIP LOCKED),
// but the deletions commit together with the caller. The worker commits every batch; from
// pg_cron, run it often enough that one call has little to do.
Datum sql_cleanup(FunctionCallInfo fcinfo) {
  int batch_size = PG_ARGISNULL(0) ? gucs::cleanup_batch_size : PG_GETARG_INT32(0);
  if (batch_size <= 0)
    throw Error(ERRCODE_INVALID_PARAMETER_VALUE, "batch_size must be positive",
                "batch_size is " + std::to_string(batch_size) + ".",
                "Pass NULL to use idempotency.cleanup_batch_size.");
  Oid table = key_store::table_of(fcinfo->flinfo->fn_oid);
  const TimestampTz now = GetCurrentTimestamp();
  uint64 total = 0;
  try {
    int rc = pg_call([] { return SPI_connect(); });
    if (rc != SPI_OK_CONNECT) throw Error(ERRCODE_INTERNAL_ERROR, "SPI_connect failed");
    Batch batch;
    do {
      batch = delete_batch(table, now, batch.last_expiry, batch_size);
      total += batch.deleted;
      pg_call([] { CHECK_FOR_INTERRUPTS(); });
    } while (batch.deleted >= static_cast<uint64>(batch_size));
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
