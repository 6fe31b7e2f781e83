// The deletions of the cleanup (cleanup.hpp): batch statements, their transactions, and the
// pass over keys of dropped roles.
#include "cleanup.hpp"

#include <algorithm>

#include "caller.hpp"
#include "installation_check.hpp"
#include "cleanup_shared.hpp"
#include "gucs.hpp"
#include "key_store.hpp"
#include "pg_boundary.hpp"
#include "stats.hpp"
#include "worker_session.hpp"

namespace idem::cleanup {
namespace {

// About as many rows as fit a heap page of the key table (rows of 150 to 250 bytes, fillfactor
// 90): an orphan batch reads batch_size / kRowsPerPage pages, about batch_size rows.
constexpr int kRowsPerPage = 32;

// $1 now, $2 batch size, $3 lower bound of expires_at. The inner SELECT walks the
// expires_at index in order and locks rows without waiting; the DELETE then reaches the
// locked rows by their ctid (a TID scan) and checks the expiry once more.
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

// Up to $3 keys in the blocks [$1, $2) whose owner names no role (dropped or renamed),
// locked without waiting and deleted. The owner is the role's name, compared with
// pg_authid.rolname; the range is read by a TID range scan.
std::string orphans_sql(const std::string& table) {
  const std::string orphan =
      " NOT EXISTS (SELECT FROM pg_catalog.pg_authid a"
      " WHERE a.rolname OPERATOR(pg_catalog.=) k.owner)";
  return "WITH gone AS (DELETE FROM " + table +
         " k WHERE ctid OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT ctid FROM " + table +
         " k WHERE ctid OPERATOR(pg_catalog.>=) $1 AND ctid OPERATOR(pg_catalog.<) $2 AND" +
         orphan + " LIMIT $3 FOR UPDATE SKIP LOCKED)) AND" + orphan +
         " RETURNING 1) SELECT pg_catalog.count(*) FROM gone";
}

enum PlanId { kBatch, kOrphans, kPlanCount };

// Plans kept by the process for the relation they were made for (the table, or a Citus
// shard; a new OID after DROP and CREATE EXTENSION makes them stale).
struct PlanCache {
  Oid relation = InvalidOid;
  std::array<SPIPlanPtr, kPlanCount> plans{};
};
std::array<PlanCache, 4> caches;  // a few relations: a table, or the shards a node holds
size_t next_cache = 0;

SPIPlanPtr plan_for(Oid relation, PlanId id) {
  PlanCache* cache = nullptr;
  for (PlanCache& candidate : caches)
    if (candidate.relation == relation) cache = &candidate;
  if (cache == nullptr) {
    cache = &caches[next_cache++ % caches.size()];
    for (SPIPlanPtr& old : cache->plans) {
      SPIPlanPtr freed = std::exchange(old, nullptr);
      if (freed != nullptr) pg_call([&] { SPI_freeplan(freed); });
    }
    cache->relation = relation;
  }
  if (cache->plans[id] != nullptr) return cache->plans[id];
  const std::string name = key_store::qualified_name(relation);
  std::string sql;
  std::vector<Oid> types;
  if (id == kBatch) {
    sql = batch_sql(name);
    types = {TIMESTAMPTZOID, INT4OID, TIMESTAMPTZOID};
  } else {
    sql = orphans_sql(name);
    types = {TIDOID, TIDOID, INT4OID};
  }
  SPIPlanPtr plan = pg_call([&] {
    // Generic from the start: the shape (an index scan, or a TID range scan, under a LIMIT)
    // is the right one whatever the values, and custom plans would be re-planned every batch.
    return SPI_prepare_cursor(sql.c_str(), static_cast<int>(types.size()), types.data(),
                              CURSOR_OPT_GENERIC_PLAN);
  });
  if (plan == nullptr)
    throw Error(ERRCODE_INTERNAL_ERROR, "could not prepare a cleanup statement",
                SPI_result_code_string(SPI_result));
  pg_call([&] { SPI_keepplan(plan); });
  cache->plans[id] = plan;
  return plan;
}

// Runs a kept plan that returns one row of bigint (and timestamptz) columns; checks their
// types, reads them and frees the result before returning.
struct Row {
  int64 count = 0;
  bool has_time = false;
  TimestampTz time = 0;
};
Row run_one_row(Oid relation, PlanId id, Datum* values, std::initializer_list<Oid> types) {
  SPIPlanPtr plan = plan_for(relation, id);
  int rc = pg_call([&] { return SPI_execute_plan(plan, values, nullptr, false, 0); });
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
    // The columns are checked above and by value: SPI_getbinval cannot raise on them.
    Datum count = SPI_getbinval(table->vals[0], table->tupdesc, 1, &is_null);  // pg: see above
    row.count = DatumGetInt64(count);
    if (types.size() > 1) {
      Datum time = SPI_getbinval(table->vals[0], table->tupdesc, 2, &is_null);  // pg: see above
      row.has_time = !is_null;
      row.time = is_null ? 0 : DatumGetTimestampTz(time);
    }
  }
  if (table != nullptr) pg_call([&] { SPI_freetuptable(table); });
  if (!shaped)
    throw Error(ERRCODE_INTERNAL_ERROR, "a cleanup statement failed or returned unexpected rows",
                SPI_result_code_string(rc));
  return row;
}

// Under Citus, a distributed idempotency_keys is an empty shell: its rows live in shard
// tables (idempotency_keys_<shardid>, same schema, same owner), and the node that holds a
// shard's placement is where every call for its keys runs (the functions are delegated).
// So each node cleans its own placements and no node touches the shell. Returns the
// relations that hold keys on this node, in OID order (a pass walks them in that order
// across rounds). Needs an open SPI connection.
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
  SPITupleTable* result = SPI_tuptable;
  const uint64 rows = SPI_processed;
  std::vector<int64> shards;
  bool shaped = rc == SPI_OK_SELECT &&
                (rows == 0 || (result->tupdesc->natts == 1 &&
                               TupleDescAttr(result->tupdesc, 0)->atttypid == INT8OID));
  for (uint64 i = 0; shaped && i < rows; ++i) {
    bool is_null = false;
    // The column is checked above and by value: SPI_getbinval cannot raise on it.
    Datum shard = SPI_getbinval(result->vals[i], result->tupdesc, 1, &is_null);  // pg: see above
    if (!is_null) shards.push_back(DatumGetInt64(shard));
  }
  if (result != nullptr) pg_call([&] { SPI_freetuptable(result); });
  if (rc != SPI_OK_SELECT)
    throw Error(ERRCODE_INTERNAL_ERROR, "could not read Citus' shard placements",
                SPI_result_code_string(rc));
  if (!shaped) throw Error(ERRCODE_DATATYPE_MISMATCH, "pg_dist_shard.shardid is not bigint");
  if (rows == 0) return {table};  // not distributed: an ordinary table
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
  std::sort(relations.begin(), relations.end());
  return relations;
}

struct Batch {
  uint64 deleted = 0;
  bool full = false;                     // a relation gave batch_size rows: more may be left
  TimestampTz last_expiry = DT_NOBEGIN;  // largest expires_at deleted; the next lower bound
};

// One batch of expired keys in every relation that holds keys here. Needs an open SPI
// connection.
Batch delete_expired(Oid table, TimestampTz now, TimestampTz from, int batch_size) {
  const std::vector<Oid> relations = key_relations(table);
  const bool sharded = !(relations.size() == 1 && relations[0] == table);
  Batch batch;
  batch.last_expiry = from;
  for (Oid relation : relations) {
    // Shards start from the beginning of their index each time: `from` is the table's.
    Datum values[] = {TimestampTzGetDatum(now), Int32GetDatum(batch_size),
                      TimestampTzGetDatum(sharded ? DT_NOBEGIN : from)};
    Row row = run_one_row(relation, kBatch, values, {INT8OID, TIMESTAMPTZOID});
    batch.deleted += static_cast<uint64>(row.count);
    batch.full = batch.full || row.count >= batch_size;
    if (!sharded && row.has_time) batch.last_expiry = row.time;
  }
  return batch;
}

// Is the background cleanup off here: idempotency.cleanup_worker = off in postgresql.conf,
// or for this database (ALTER DATABASE ... SET, which only a superuser may make for a
// superuser-only parameter)? The database's setting is read from pg_db_role_setting with a
// catalog snapshot taken now: a setting committed before it is seen.
bool paused_here() {
  if (!gucs::cleanup_worker) return true;
  return pg_call([] {
    InvalidateCatalogSnapshot();
    bool off = false;
    Relation catalog = table_open(DbRoleSettingRelationId, AccessShareLock);
    ScanKeyData keys[2];
    ScanKeyInit(&keys[0], Anum_pg_db_role_setting_setdatabase, BTEqualStrategyNumber, F_OIDEQ,
                ObjectIdGetDatum(MyDatabaseId));
    ScanKeyInit(&keys[1], Anum_pg_db_role_setting_setrole, BTEqualStrategyNumber, F_OIDEQ,
                ObjectIdGetDatum(InvalidOid));
    SysScanDesc scan =
        systable_beginscan(catalog, DbRoleSettingDatidRolidIndexId, true, nullptr, 2, keys);
    HeapTuple tuple = systable_getnext(scan);
    bool is_null = true;
    Datum config = HeapTupleIsValid(tuple) ? heap_getattr(tuple, Anum_pg_db_role_setting_setconfig,
                                                          RelationGetDescr(catalog), &is_null)
                                           : static_cast<Datum>(0);
    if (!is_null) {
      Datum* items = nullptr;
      int count = 0;
      deconstruct_array(DatumGetArrayTypeP(config), TEXTOID, -1, false, TYPALIGN_INT, &items,
                        nullptr, &count);
      const char* prefix = "idempotency.cleanup_worker=";
      for (int i = 0; i < count; ++i) {
        const char* item = TextDatumGetCString(items[i]);
        bool value = true;
        if (pg_strncasecmp(item, prefix, strlen(prefix)) == 0 &&
            parse_bool(item + strlen(prefix), &value) && !value)
          off = true;
      }
    }
    systable_endscan(scan);
    table_close(catalog, AccessShareLock);
    return off;
  });
}

enum class Step { kDone, kNotInstalled, kPaused };

// Runs `body(installation)` in a transaction of its own (worker_spi's pattern: a fresh
// snapshot, an SPI connection, the batch deadline, all released before returning) as the
// installation's owner, and commits it. The installation is looked up and checked in every
// transaction (caller.hpp). When the request obeys the pause, a batch made while the pause
// was set is rolled back instead of committed.
[[noreturn]] void reject_other_installation() {
  throw Error(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
              "idempotency_cleanup() sees another installation of the extension than its caller",
              "The deletions run in a transaction of their own, which sees only what is "
              "committed: the calling transaction dropped or created the extension.",
              "Call idempotency_cleanup() after that transaction has committed.");
}

template <typename Body>
Step in_transaction(const Request& request, Progress& progress, const char* activity, Body&& body) {
  pg_call([&] {
    SetCurrentStatementStartTimestamp();
    StartTransactionCommand();
    worker_session::arm_batch_deadline();
    PushActiveSnapshot(GetTransactionSnapshot());
    pgstat_report_activity(STATE_RUNNING, activity);
  });
  // The calling transaction may have dropped and created the extension: the committed
  // installation's table, found by name without a lock (a full check would wait on the
  // calling transaction's lock of the dropped table), tells.
  if (OidIsValid(request.table)) {
    const Oid committed = pg_call([] {
      Oid extension = InvalidOid;
      Oid schema = InvalidOid;
      return installation_check::find_extension(&extension, &schema)
                 ? get_relname_relid("idempotency_keys", schema)
                 : InvalidOid;
    });
    if (OidIsValid(committed) && committed != request.table) reject_other_installation();
  }
  std::optional<caller::Installation> installation = caller::of_database();
  Step step = Step::kDone;
  if (!installation)
    step = Step::kNotInstalled;
  else if (request.obey_pause && paused_here())
    step = Step::kPaused;
  if (installation && OidIsValid(request.table) && installation->table != request.table)
    reject_other_installation();
  if (step == Step::kDone) {
    caller::ActingAsOwner acting(*installation);
    pg_call([] {
      if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "SPI_connect failed");
    });
    body(*installation);
    // Measured before SPI_finish frees the batch's memory: what a batch needs at most.
    progress.peak_memory =
        std::max(progress.peak_memory, MemoryContextMemAllocated(TopMemoryContext, true));
    pg_call([] { SPI_finish(); });
    // Paused while the batch ran: its snapshot may see rows committed after the pause.
    if (request.obey_pause && paused_here()) step = Step::kPaused;
  }
  pg_call([&] {
    PopActiveSnapshot();
    if (step == Step::kPaused)
      AbortCurrentTransaction();
    else
      CommitTransactionCommand();
    worker_session::disarm_batch_deadline();
    pgstat_report_activity(STATE_IDLE, nullptr);
  });
  return step;
}

// The pause after a batch that found more to do, and a chance to stop.
void pause_after(const Request& request, TimestampTz batch_start) {
  // Between two full batches, a pause like vacuum's cost delay: deleting a backlog of
  // millions of keys takes CPU and writes WAL (a full-page image for every page touched
  // first after a checkpoint) that the sessions' commits would otherwise flush along
  // with their own. The pause is idempotency.cleanup_delay, or as long as the batch
  // took if that is longer: the worker works at most half of the time, and backs off
  // further when a busy server makes its batches slow.
  const int64 batch_ms = (GetCurrentTimestamp() - batch_start) / 1000;
  int delay_ms = 0;
  if (request.pause_between && gucs::cleanup_delay_ms > 0)
    delay_ms =
        static_cast<int>(std::min<int64>(std::max<int64>(gucs::cleanup_delay_ms, batch_ms), 1000));
  pg_call([&] {
    if (delay_ms > 0) {
      (void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, delay_ms,
                      PG_WAIT_EXTENSION);
      ResetLatch(MyLatch);
    }
  });
  check_for_interrupts();
}

// Should the run stop here (keys may be left)? Its time is up, the process is asked to stop,
// or the backend that waits for it is gone.
bool should_stop(const Request& request, TimestampTz started) {
  if (worker_session::stop_requested()) return true;
  if (request.time_budget_us > 0 && GetCurrentTimestamp() - started >= request.time_budget_us)
    return true;
  if (request.requester != 0)
    return pg_call([&] { return BackendPidGetProc(request.requester) == nullptr; });
  return false;
}

// The pass over keys of dropped or renamed roles, when one is due; false when the run must
// stop (paused, out of time) before the expired keys.
bool delete_orphans(const Request& request, Oid table, TimestampTz started, Progress& progress) {
  const Oid database = MyDatabaseId;
  const uint64 generation = cleanup_shared::role_generation();
  if (!stats::orphan_pass_due(database, table, generation)) return true;
  stats::OrphanPass pass = stats::orphan_pass_progress(database);
  if (!request.resume || pass.generation != generation || pass.table != table)
    pass = {generation, table, InvalidOid, 0};
  const BlockNumber blocks_per_batch =
      static_cast<BlockNumber>(std::max(1, request.batch_size / kRowsPerPage));
  for (;;) {
    const TimestampTz batch_start = GetCurrentTimestamp();
    bool complete = false;
    uint64 deleted = 0;
    progress.orphan_pass = true;
    const Step step = in_transaction(
        request, progress, "idempotency cleanup: deleting keys of dropped roles",
        [&](const caller::Installation&) {
          const std::vector<Oid> relations = key_relations(table);
          // The relation the pass has reached, or the next one: a shard may have moved away.
          auto at = std::lower_bound(relations.begin(), relations.end(), pass.relation);
          if (at != relations.end() && *at != pass.relation) pass.block = 0;
          while (at != relations.end()) {
            const Oid relation = *at;
            BlockNumber blocks = pg_call([&] {
              Relation open = relation_open(relation, AccessShareLock);
              BlockNumber count = RelationGetNumberOfBlocks(open);
              relation_close(open, AccessShareLock);
              return count;
            });
            if (pass.block < blocks) {
              pass.relation = relation;
              ItemPointerData low;
              ItemPointerData high;
              const BlockNumber end = pass.block + std::min(blocks_per_batch, blocks - pass.block);
              ItemPointerSet(&low, pass.block, 0);
              ItemPointerSet(&high, end, 0);
              Datum values[] = {PointerGetDatum(&low), PointerGetDatum(&high),
                                Int32GetDatum(request.batch_size)};
              deleted =
                  static_cast<uint64>(run_one_row(relation, kOrphans, values, {INT8OID}).count);
              // A full batch may have left more in the same blocks: they are read again.
              if (deleted < static_cast<uint64>(request.batch_size)) pass.block = end;
              return;
            }
            ++at;
            pass.block = 0;
          }
          complete = true;
        });
    if (step == Step::kPaused) {
      progress.paused = true;
      return false;
    }
    if (step == Step::kNotInstalled) return false;  // dropped since the run started
    progress.deleted += deleted;
    stats::count(stats::kExpiredDeleted, deleted);
    if (complete) {
      stats::finish_orphan_pass(database, table, generation);
      return true;
    }
    stats::save_orphan_pass_progress(database, pass);
    pause_after(request, batch_start);
    if (should_stop(request, started)) {
      progress.unfinished = true;
      return false;
    }
  }
}

}  // namespace

void run(const Request& request, Progress& progress) {
  const TimestampTz started = GetCurrentTimestamp();
  Oid table = InvalidOid;
  const Step look =
      in_transaction(request, progress, "idempotency cleanup: looking for the extension",
                     [&](const caller::Installation& found) { table = found.table; });
  if (look == Step::kPaused) progress.paused = true;
  if (look != Step::kDone) {
    if (look == Step::kNotInstalled && OidIsValid(request.table))
      throw Error(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                  "idempotency_cleanup() finds no committed installation of the extension",
                  "The deletions run in a transaction of their own, which sees only what is "
                  "committed.");
    return;
  }
  progress.installed = true;
  if (!delete_orphans(request, table, started, progress)) return;

  Batch batch;
  // After an unfinished round, go on where it stopped instead of walking again over the
  // index entries of the keys it deleted (dead until VACUUM).
  batch.last_expiry = request.resume ? stats::resume_point(MyDatabaseId) : DT_NOBEGIN;
  for (;;) {
    const TimestampTz batch_start = GetCurrentTimestamp();
    Batch done;
    const Step step =
        in_transaction(request, progress, "idempotency cleanup: deleting a batch of expired keys",
                       [&](const caller::Installation& installation) {
                         done = delete_expired(installation.table, request.now, batch.last_expiry,
                                               request.batch_size);
                       });
    if (step == Step::kPaused) progress.paused = true;
    if (step != Step::kDone) return;
    batch = done;
    progress.deleted += batch.deleted;
    // Counted batch by batch, so that the view shows a long run's progress.
    stats::count(stats::kExpiredDeleted, batch.deleted);
    if (!batch.full) return;
    pause_after(request, batch_start);
    if (should_stop(request, started)) {
      progress.unfinished = true;
      progress.resume_from = batch.last_expiry;
      return;
    }
  }
}

void abort_failed_batch() noexcept {
  try {
    pg_call([] {
      worker_session::disarm_batch_deadline();
      // Leaves the failed transaction (and its SPI connection and snapshot).
      AbortCurrentTransaction();
      pgstat_report_activity(STATE_IDLE, nullptr);
    });
  } catch (...) {
  }
}

}  // namespace idem::cleanup
