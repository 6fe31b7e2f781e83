// The statements of the cleanup (cleanup_statements.hpp).
#include "cleanup_statements.hpp"

#include <algorithm>

#include "caller.hpp"
#include "key_layout.hpp"
#include "key_store.hpp"
#include "pg/catalog.hpp"
#include "pg/heap.hpp"
#include "pg/spi.hpp"
#include "pg_boundary.hpp"

namespace idem::cleanup::statements {
namespace {

// How the table's expiry index serves the first batch: an ordered walk of a B-Tree whose
// first column is expires_at (15), or a BRIN over expiry_bucket(expires_at) (16+), whose
// bucket the batch states so that the BRIN's bitmap may serve it (`bucket` names the
// function, schema-qualified); neither: a sequential scan.
struct ExpiryIndex {
  bool ordered = false;
  std::string bucket;
};

// $1 now, $2 batch size, $3 lower bound of expires_at. The inner SELECT walks the
// expires_at index in order and locks rows without waiting; the DELETE then reaches the
// locked rows by their ctid (a TID scan) and checks the expiry once more. Under a BRIN
// (16+, `ordered` false) no index gives that order, and sorting every match to take a batch
// would read the whole table per batch: the batch is the first expired keys in the table's
// block order instead (a bitmap or sequential scan that stops at the LIMIT; the workers never
// synchronize sequential scans, worker_session.cpp), $3 is always -infinity, and the
// statement returns the largest ctid deleted, where the next batch goes on (range_batch_sql).
// A key's bucket is never later than its expiry, so "bucket <= now" leaves out no expired key.
std::string batch_sql(const std::string& table, const ExpiryIndex& index) {
  const bool ordered = index.ordered;
  const std::string by_bucket =
      index.bucket.empty() ? ""
                           : " AND " + index.bucket + "(expires_at) OPERATOR(pg_catalog.<=) $1";
  return "WITH gone AS (DELETE FROM " + table +
         " WHERE ctid OPERATOR(pg_catalog.=) ANY (ARRAY("
         "SELECT ctid FROM " +
         table +
         " WHERE expires_at OPERATOR(pg_catalog.>=) $3"
         " AND expires_at OPERATOR(pg_catalog.<=) $1" +
         by_bucket + (ordered ? " ORDER BY expires_at" : "") +
         " LIMIT $2 FOR UPDATE SKIP LOCKED))"
         " AND expires_at OPERATOR(pg_catalog.<=) $1 RETURNING " +
         (ordered ? "expires_at" : "ctid") + ") SELECT pg_catalog.count(*), pg_catalog.max(" +
         (ordered ? "expires_at" : "ctid") + ") FROM gone";
}

// Under a BRIN, the batches after a run's first: up to $4 keys expired at $3 in the blocks
// [$1, $2), read by a TID range scan from $1 that stops at the LIMIT, locked without waiting
// and deleted; returns the largest ctid deleted (the next batch starts in its block).
std::string range_batch_sql(const std::string& table) {
  const std::string expired = " expires_at OPERATOR(pg_catalog.<=) $3";
  return "WITH gone AS (DELETE FROM " + table +
         " WHERE ctid OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT ctid FROM " + table +
         " WHERE ctid OPERATOR(pg_catalog.>=) $1 AND ctid OPERATOR(pg_catalog.<) $2 AND" + expired +
         " LIMIT $4 FOR UPDATE SKIP LOCKED)) AND" + expired +
         " RETURNING ctid) SELECT pg_catalog.count(*), pg_catalog.max(ctid) FROM gone";
}

// The expiry index of `relation` (see ExpiryIndex).
ExpiryIndex expiry_index_of(Oid relation) {
  const pg::catalog::ColumnIndexes found =
      pg::catalog::indexes_on(relation, "expires_at", key_layout::is_expiry_bucket_key);
  ExpiryIndex index;
  index.ordered = found.btree_led;
  if (OidIsValid(found.brin_key_function))
    index.bucket = pg::catalog::qualified_function_name(found.brin_key_function);
  return index;
}

// Up to $3 keys in the blocks [$1, $2) that no role owns, locked without waiting and deleted:
// a key whose owner names no role (dropped or renamed), and a key stamped in this cluster ($4,
// the system identifier) whose OID is no longer the role of that name (dropped, renamed, or
// its name taken by a newer role; key_row.hpp, belongs_to). The range is read by a TID range
// scan. Also counts the keys of no role that the statement's snapshot sees in the range (the
// deleted ones among them): more than were deleted, in a batch that was not full, means some
// were skipped, locked by another transaction, and the pass must be made again.
constexpr const char* kForeign =
    "(k.owner_oid IS NULL OR k.owner_system IS NULL OR k.owner_system OPERATOR(pg_catalog.<>) ";
std::string orphans_sql(const std::string& table) {
  const std::string orphan =
      " NOT EXISTS (SELECT FROM pg_catalog.pg_authid a"
      " WHERE a.rolname OPERATOR(pg_catalog.=) k.owner AND " +
      std::string(kForeign) + "$4 OR a.oid OPERATOR(pg_catalog.=) k.owner_oid))";
  const std::string in_range =
      " k WHERE ctid OPERATOR(pg_catalog.>=) $1 AND ctid OPERATOR(pg_catalog.<) $2 AND";
  return "WITH gone AS (DELETE FROM " + table + " k WHERE ctid OPERATOR(pg_catalog.=) ANY " +
         "(ARRAY(SELECT ctid FROM " + table + in_range + orphan +
         " LIMIT $3 FOR UPDATE SKIP LOCKED)) AND" + orphan +
         " RETURNING 1) SELECT pg_catalog.count(*), (SELECT pg_catalog.count(*) FROM " + table +
         in_range + orphan + ") FROM gone";
}

// The keys in the blocks [$1, $2) that are unstamped or stamped in another cluster (restored,
// replicated, moved here) and whose owner names a role: stamped with that role's OID and this
// cluster's system identifier ($3), so that a role made later under the same name no longer
// adopts them. Rows locked by another transaction are skipped (a claim writing one stamps it).
std::string adopt_sql(const std::string& table) {
  const std::string foreign = std::string(kForeign) + "$3)";
  return "WITH adopted AS (UPDATE " + table +
         " k SET owner_oid = a.oid, owner_system = $3 FROM pg_catalog.pg_authid a"
         " WHERE k.ctid OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT ctid FROM " +
         table +
         " k WHERE ctid OPERATOR(pg_catalog.>=) $1 AND ctid OPERATOR(pg_catalog.<) $2 AND " +
         foreign + " FOR UPDATE SKIP LOCKED)) AND a.rolname OPERATOR(pg_catalog.=) k.owner AND " +
         foreign + " RETURNING 1) SELECT pg_catalog.count(*) FROM adopted";
}

// Up to $2 keys whose response passed its time ($1: now) and is still stored: the response's
// three columns set to NULL; response_expires_at stays, so that a replay still says that the
// response was dropped. No index leads to these rows (every claim would pay for one more index
// entry): the statement reads the table until it has $2 of them, or to its end.
std::string drop_responses_sql(const std::string& table) {
  const std::string due =
      " response_expires_at OPERATOR(pg_catalog.<=) $1 AND (response IS NOT NULL OR"
      " response_body IS NOT NULL OR response_headers IS NOT NULL)";
  return "WITH dropped AS (UPDATE " + table +
         " SET response = NULL, response_body = NULL, response_headers = NULL"
         " WHERE ctid OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT ctid FROM " +
         table + " WHERE" + due + " LIMIT $2 FOR UPDATE SKIP LOCKED)) AND" + due +
         " RETURNING 1) SELECT pg_catalog.count(*) FROM dropped";
}

enum PlanId { kBatch, kRangeBatch, kOrphans, kAdopt, kDropResponses, kPlanCount };

// Plans kept by the process for the relation they were made for (the table, or a Citus
// shard; a new OID after DROP and CREATE EXTENSION makes them stale).
struct PlanCache {
  Oid relation = InvalidOid;
  bool ordered = true;  // expiry_index_of(...).ordered, when the batch's plan was made
  std::array<SPIPlanPtr, kPlanCount> plans{};
};
std::array<PlanCache, 4> caches;  // a few relations: a table, or the shards a node holds
size_t next_cache = 0;

PlanCache& cache_for(Oid relation) {
  PlanCache* cache = nullptr;
  for (PlanCache& candidate : caches)
    if (candidate.relation == relation) cache = &candidate;
  if (cache == nullptr) {
    cache = &caches[next_cache++ % caches.size()];
    for (SPIPlanPtr& old : cache->plans) {
      SPIPlanPtr freed = std::exchange(old, nullptr);
      if (freed != nullptr) pg::spi::free_plan(freed);
    }
    cache->relation = relation;
  }
  return *cache;
}

SPIPlanPtr plan_for(Oid relation, PlanId id) {
  PlanCache* cache = &cache_for(relation);
  if (cache->plans[id] != nullptr) return cache->plans[id];
  const std::string name = key_store::qualified_name(relation);
  std::string sql;
  std::vector<Oid> types;
  if (id == kBatch) {
    const ExpiryIndex index = expiry_index_of(relation);
    cache->ordered = index.ordered;
    sql = batch_sql(name, index);
    types = {TIMESTAMPTZOID, INT4OID, TIMESTAMPTZOID};
  } else if (id == kRangeBatch) {
    sql = range_batch_sql(name);
    types = {TIDOID, TIDOID, TIMESTAMPTZOID, INT4OID};
  } else if (id == kDropResponses) {
    sql = drop_responses_sql(name);
    types = {TIMESTAMPTZOID, INT4OID};
  } else if (id == kOrphans) {
    sql = orphans_sql(name);
    types = {TIDOID, TIDOID, INT4OID, INT8OID};
  } else {
    sql = adopt_sql(name);
    types = {TIDOID, TIDOID, INT8OID};
  }
  // Generic from the start: the shape (an index scan, or a TID range scan, under a LIMIT) is
  // the right one whatever the values, and custom plans would be re-planned every batch.
  SPIPlanPtr plan =
      pg::spi::prepare_kept(sql.c_str(), static_cast<int>(types.size()), types.data());
  if (plan == nullptr)
    throw Error(ERRCODE_INTERNAL_ERROR, "could not prepare a cleanup statement",
                SPI_result_code_string(SPI_result));
  cache->plans[id] = plan;
  return plan;
}

// Runs a kept plan that returns one row of bigint (and timestamptz) columns; checks their
// types, reads them and frees the result before returning.
struct Row {
  int64 count = 0;
  bool has_time = false;
  TimestampTz time = 0;    // a second column of type timestamptz
  int64 second_count = 0;  // a second column of type bigint
  bool has_tid = false;
  ItemPointerData tid{};  // a second column of type tid
};
Row run_one_row(Oid relation, PlanId id, Datum* values, std::initializer_list<Oid> types) {
  SPIPlanPtr plan = plan_for(relation, id);
  int rc = pg::spi::execute_plan(plan, values, nullptr, false, 0);
  SPITupleTable* table = SPI_tuptable;
  const uint64 rows = SPI_processed;
  Row row;
  bool shaped = rc == SPI_OK_SELECT && rows == 1 && table != nullptr &&
                table->tupdesc->natts == static_cast<int>(types.size());
  int column = 0;
  for (Oid type : types)
    shaped = shaped && TupleDescAttr(table->tupdesc, column++)->atttypid == type;
  if (shaped) {
    bool is_null = false;
    // The columns are checked above and by value: reading them cannot raise.
    Datum count = pg::spi::column_unchecked(table->vals[0], table->tupdesc, 1, &is_null);
    row.count = DatumGetInt64(count);
    if (types.size() > 1) {
      Datum second = pg::spi::column_unchecked(table->vals[0], table->tupdesc, 2, &is_null);
      if (*(types.begin() + 1) == INT8OID) {
        row.second_count = is_null ? 0 : DatumGetInt64(second);
      } else if (*(types.begin() + 1) == TIDOID) {
        row.has_tid = !is_null;
        // (DatumGetItemPointer is not in the headers of 15.)
        if (!is_null)
          ItemPointerCopy(reinterpret_cast<ItemPointer>(DatumGetPointer(second)), &row.tid);
      } else {
        row.has_time = !is_null;
        row.time = is_null ? 0 : DatumGetTimestampTz(second);
      }
    }
  }
  pg::spi::free_result();
  if (!shaped)
    throw Error(ERRCODE_INTERNAL_ERROR, "a cleanup statement failed or returned unexpected rows",
                SPI_result_code_string(rc));
  return row;
}

}  // namespace

// Under Citus, a distributed idempotency_keys is an empty shell: its rows live in shard
// tables (idempotency_keys_<shardid>, same schema, same owner), and the node that holds a
// shard's placement is where every call for its keys runs (the functions are delegated).
// So each node cleans its own placements and no node touches the shell. Returns the
// relations that hold keys on this node, in OID order (a pass walks them in that order
// across rounds). Needs an open SPI connection.
std::vector<Oid> key_relations(Oid table) {
  const bool citus =
      OidIsValid(pg::catalog::relation_id("pg_dist_partition", PG_CATALOG_NAMESPACE));
  if (!citus) return {table};
  Oid types[] = {REGCLASSOID};
  Datum values[] = {ObjectIdGetDatum(table)};
  int rc = pg::spi::execute_read_only(
      "SELECT s.shardid FROM pg_catalog.pg_dist_partition d"
      " LEFT JOIN pg_catalog.pg_dist_shard s ON s.logicalrelid OPERATOR(pg_catalog.=) "
      "d.logicalrelid"
      " AND EXISTS (SELECT FROM pg_catalog.pg_dist_placement p"
      " WHERE p.shardid OPERATOR(pg_catalog.=) s.shardid AND p.groupid OPERATOR(pg_catalog.=)"
      " (SELECT groupid FROM pg_catalog.pg_dist_local_group))"
      " WHERE d.logicalrelid OPERATOR(pg_catalog.=) $1",
      1, types, values);
  SPITupleTable* result = SPI_tuptable;
  const uint64 rows = SPI_processed;
  std::vector<int64> shards;
  bool shaped = rc == SPI_OK_SELECT &&
                (rows == 0 || (result->tupdesc->natts == 1 &&
                               TupleDescAttr(result->tupdesc, 0)->atttypid == INT8OID));
  for (uint64 i = 0; shaped && i < rows; ++i) {
    bool is_null = false;
    // The column is checked above and by value: reading it cannot raise.
    Datum shard = pg::spi::column_unchecked(result->vals[i], result->tupdesc, 1, &is_null);
    if (!is_null) shards.push_back(DatumGetInt64(shard));
  }
  pg::spi::free_result();
  if (rc != SPI_OK_SELECT)
    throw Error(ERRCODE_INTERNAL_ERROR, "could not read Citus' shard placements",
                SPI_result_code_string(rc));
  if (!shaped) throw Error(ERRCODE_DATATYPE_MISMATCH, "pg_dist_shard.shardid is not bigint");
  if (rows == 0) return {table};  // not distributed: an ordinary table
  std::vector<Oid> relations;
  for (int64 shard : shards) {
    const std::string name = "idempotency_keys_" + std::to_string(shard);
    // A placement of ours is created by Citus as the owner of the distributed table.
    const Oid relation = pg::catalog::relation_owned_by_superuser(name.c_str(), table);
    if (!OidIsValid(relation))
      throw Error(ERRCODE_INSUFFICIENT_PRIVILEGE,
                  "shard " + name + " of idempotency_keys is missing or not owned by a superuser");
    relations.push_back(relation);
  }
  std::sort(relations.begin(), relations.end());
  return relations;
}

Batch delete_expired(Oid table, TimestampTz now, Cursor& cursor, int batch_size) {
  const std::vector<Oid> relations = key_relations(table);
  const bool sharded = !(relations.size() == 1 && relations[0] == table);
  Batch batch;
  for (Oid relation : relations) {
    plan_for(relation, kBatch);
    const bool ordered = cache_for(relation).ordered;
    if (!sharded && !ordered && (cursor.walking || cursor.start != 0)) {
      // A BRIN, after the run's first batch (or from where an unfinished round stopped): the
      // blocks from where the last batch stopped to the end, then once [0, start).
      ItemPointerData low;
      ItemPointerData high;
      ItemPointerSet(&low, cursor.block, 0);
      ItemPointerSet(&high, cursor.wrapped ? cursor.start : InvalidBlockNumber, 0);
      Datum values[] = {PointerGetDatum(&low), PointerGetDatum(&high), TimestampTzGetDatum(now),
                        Int32GetDatum(batch_size)};
      const Row row = run_one_row(relation, kRangeBatch, values, {INT8OID, TIDOID});
      cursor.walking = true;
      batch.deleted += static_cast<uint64>(row.count);
      if (row.count >= batch_size && row.has_tid) {
        cursor.block = ItemPointerGetBlockNumber(&row.tid);
        batch.full = true;
      } else if (!cursor.wrapped && cursor.start != 0) {
        cursor.wrapped = true;
        cursor.block = 0;
        batch.full = true;
      }
      continue;
    }
    // Shards start from the beginning of their index each time: `cursor` is the table's.
    Datum values[] = {TimestampTzGetDatum(now), Int32GetDatum(batch_size),
                      TimestampTzGetDatum(sharded || !ordered ? DT_NOBEGIN : cursor.expiry)};
    const Row row = run_one_row(relation, kBatch, values,
                                {INT8OID, static_cast<Oid>(ordered ? TIMESTAMPTZOID : TIDOID)});
    batch.deleted += static_cast<uint64>(row.count);
    batch.full = batch.full || row.count >= batch_size;
    if (sharded) continue;
    if (ordered && row.has_time) cursor.expiry = row.time;
    if (!ordered) {
      cursor.walking = true;
      if (row.has_tid) cursor.block = ItemPointerGetBlockNumber(&row.tid);
    }
  }
  return batch;
}

Batch drop_responses(Oid table, TimestampTz now, int batch_size) {
  Batch batch;
  for (Oid relation : key_relations(table)) {
    Datum values[] = {TimestampTzGetDatum(now), Int32GetDatum(batch_size)};
    Row row = run_one_row(relation, kDropResponses, values, {INT8OID});
    batch.deleted += static_cast<uint64>(row.count);
    batch.full = batch.full || row.count >= batch_size;
  }
  return batch;
}

Orphans delete_orphans_in(Oid relation, BlockNumber from, BlockNumber to, int limit) {
  ItemPointerData low;
  ItemPointerData high;
  ItemPointerSet(&low, from, 0);
  ItemPointerSet(&high, to, 0);
  const Datum system = Int64GetDatum(caller::system_identifier());
  Datum values[] = {PointerGetDatum(&low), PointerGetDatum(&high), Int32GetDatum(limit), system};
  const Row row = run_one_row(relation, kOrphans, values, {INT8OID, INT8OID});
  Datum adopt_values[] = {PointerGetDatum(&low), PointerGetDatum(&high), system};
  const Row adopted = run_one_row(relation, kAdopt, adopt_values, {INT8OID});
  Orphans orphans;
  orphans.deleted = static_cast<uint64>(row.count);
  orphans.adopted = static_cast<uint64>(adopted.count);
  // A full batch leaves the rest to the next batch over the same blocks: nothing skipped yet.
  orphans.skipped = row.count < limit && row.second_count > row.count;
  return orphans;
}

BlockNumber relation_blocks(Oid relation) {
  // A Citus shard listed a moment ago may be dropped by a move now: no blocks to clean.
  return pg::heap::block_count(relation);
}

}  // namespace idem::cleanup::statements
