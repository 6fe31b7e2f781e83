// The cleanup background worker (SPEC §5).
//
// Two kinds of process:
//   - the launcher, registered at server start by shared_preload_libraries. It connects to
//     no database (so it never stands in the way of DROP DATABASE), reads pg_database every
//     idempotency.cleanup_interval and starts one short-lived worker per database it serves;
//   - the database worker, started dynamically with the database OID as its argument. It
//     connects, looks for the extension in pg_extension (and exits at once if it is not
//     installed), deletes expired keys batch by batch, each batch its own transaction and
//     snapshot, records the round in idempotency_stats and exits. A connected process
//     lives only for one round, so DROP DATABASE waits at most for one batch.
// The launcher keeps the handle of each worker it started and never starts a second one
// for a database whose worker still runs. An error in a round is logged and recorded in
// the statistics; the worker then exits normally and the next round tries again, so a
// persistent error never turns into a crash-restart loop.
//
// Everything here runs in background processes whose ERROR/FATAL paths end the process
// (the postmaster's bgworker frame catches them): the code keeps no C++ object with a
// destructor in frames that PostgreSQL may longjmp over, except in the round itself,
// where every PostgreSQL call goes through pg_call().
#include "cleanup_worker.hpp"

#include <sys/resource.h>

#include "caller.hpp"
#include "cleanup.hpp"
#include "gucs.hpp"
#include "pg_boundary.hpp"
#include "stats.hpp"

extern "C" {
PGDLLEXPORT void idempotency_cleanup_launcher_main(Datum argument);
PGDLLEXPORT void idempotency_cleanup_database_main(Datum argument);
}

namespace idem::cleanup_worker {
namespace {

constexpr const char* kLibrary = "idempotency";
constexpr const char* kLauncherType = "idempotency cleanup launcher";
constexpr const char* kWorkerType = "idempotency cleanup";
// Database workers that run at the same time: a few, so that many databases are served
// quickly without taking every max_worker_processes slot.
constexpr int kMaxRunning = 4;
// After a failed registration (no free worker slot), try again this much later.
constexpr long kRetryMs = 1000;
// Seconds before the postmaster starts the launcher again when it exits with an error.
constexpr int kLauncherRestartSeconds = 5;
// A database worker stops after this much work and the launcher starts the next round at
// once: a connection never lasts much longer than this, so DROP DATABASE (which waits up to
// 5 s for other connections to go) always gets through, even during a long cleanup.
constexpr int64 kRoundMicroseconds = 1000 * 1000;
// The database worker's nice value (see database_main).
constexpr int kWorkerNice = 10;

// ---------------------------------------------------------------------------------------
// The launcher
// ---------------------------------------------------------------------------------------

struct Running {
  Oid database;
  BackgroundWorkerHandle* handle;
};

struct LauncherState {
  MemoryContext context;  // handles and the pending list live here, across transactions
  Running running[kMaxRunning];
  int running_count;
  Oid* pending;  // databases of the current round not started yet
  int pending_capacity;
  int pending_count;
  int pending_next;
};

// Is `name` in idempotency.databases (empty: every database)? Names are compared exactly.
bool served_by_setting(const char* name) {
  const char* list = gucs::databases;
  if (list == nullptr || list[0] == '\0') return true;
  const size_t length = strlen(name);
  const char* p = list;
  while (*p != '\0') {
    while (*p == ' ' || *p == '\t' || *p == ',') ++p;
    const char* start = p;
    while (*p != '\0' && *p != ',') ++p;
    const char* end = p;
    while (end > start && (end[-1] == ' ' || end[-1] == '\t')) --end;
    if (static_cast<size_t>(end - start) == length && length > 0 &&
        strncmp(start, name, length) == 0)
      return true;
  }
  return false;
}

bool is_running(const LauncherState& state, Oid database) {
  for (int i = 0; i < state.running_count; ++i)
    if (state.running[i].database == database) return true;
  return false;
}

// Reads pg_database (a shared catalog: no database connection needed) in a transaction
// that ends before this returns: the launcher holds no snapshot between rounds. Fills the
// pending list with the databases to serve, and frees the statistics of dropped ones.
void plan_round(LauncherState& state) {
  SetCurrentStatementStartTimestamp();
  StartTransactionCommand();
  (void)GetTransactionSnapshot();
  pgstat_report_activity(STATE_RUNNING, "reading pg_database");

  MemoryContext old = MemoryContextSwitchTo(state.context);
  if (state.pending != nullptr) pfree(state.pending);
  int capacity = 16;
  int existing_count = 0;
  state.pending = static_cast<Oid*>(palloc(capacity * sizeof(Oid)));
  state.pending_capacity = capacity;
  Oid* existing = static_cast<Oid*>(palloc(capacity * sizeof(Oid)));
  state.pending_count = 0;
  state.pending_next = 0;

  Relation relation = table_open(DatabaseRelationId, AccessShareLock);
  TableScanDesc scan = table_beginscan_catalog(relation, 0, nullptr);
  HeapTuple tuple;
  while ((tuple = heap_getnext(scan, ForwardScanDirection)) != nullptr) {
    auto* database = reinterpret_cast<Form_pg_database>(GETSTRUCT(tuple));
    if (existing_count == capacity) {
      capacity *= 2;
      existing = static_cast<Oid*>(repalloc(existing, capacity * sizeof(Oid)));
      state.pending = static_cast<Oid*>(repalloc(state.pending, capacity * sizeof(Oid)));
      state.pending_capacity = capacity;
    }
    existing[existing_count++] = database->oid;
    // Templates are skipped: a connection to template1 would make CREATE DATABASE fail.
    // So are databases that take no connections or are half dropped.
    if (database->datistemplate || !database->datallowconn || database_is_invalid_form(database))
      continue;
    if (!served_by_setting(NameStr(database->datname))) continue;
    if (is_running(state, database->oid)) continue;  // at most one worker per database
    state.pending[state.pending_count++] = database->oid;
  }
  table_endscan(scan);
  table_close(relation, AccessShareLock);
  MemoryContextSwitchTo(old);

  CommitTransactionCommand();
  stats::forget_dropped_databases(existing, existing_count);
  pfree(existing);
  pgstat_report_activity(STATE_IDLE, nullptr);
}

// Adds a database to the pending list (grown as needed, in the launcher's context).
void push_pending(LauncherState& state, Oid database) {
  for (int i = state.pending_next; i < state.pending_count; ++i)
    if (state.pending[i] == database) return;
  if (state.pending == nullptr || state.pending_count == state.pending_capacity) {
    int capacity = state.pending_capacity == 0 ? 16 : state.pending_capacity * 2;
    MemoryContext old = MemoryContextSwitchTo(state.context);
    state.pending = state.pending == nullptr
                        ? static_cast<Oid*>(palloc(capacity * sizeof(Oid)))
                        : static_cast<Oid*>(repalloc(state.pending, capacity * sizeof(Oid)));
    MemoryContextSwitchTo(old);
    state.pending_capacity = capacity;
  }
  state.pending[state.pending_count++] = database;
}

// Forgets workers that have exited; a database whose round stopped with expired keys left
// gets its next round at once.
void reap(LauncherState& state) {
  int kept = 0;
  for (int i = 0; i < state.running_count; ++i) {
    pid_t pid;
    if (GetBackgroundWorkerPid(state.running[i].handle, &pid) == BGWH_STOPPED) {
      pfree(state.running[i].handle);
      if (stats::take_unfinished(state.running[i].database))
        push_pending(state, state.running[i].database);
      continue;
    }
    state.running[kept++] = state.running[i];
  }
  state.running_count = kept;
}

// Starts workers for pending databases while slots allow; false when a registration
// failed (every max_worker_processes slot is taken) and should be retried soon.
bool start_pending(LauncherState& state) {
  while (state.running_count < kMaxRunning && state.pending_next < state.pending_count) {
    Oid database = state.pending[state.pending_next];
    BackgroundWorker worker;
    memset(&worker, 0, sizeof worker);
    worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
    worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
    worker.bgw_restart_time = BGW_NEVER_RESTART;  // the next round is the retry
    strlcpy(worker.bgw_library_name, kLibrary, BGW_MAXLEN);
    strlcpy(worker.bgw_function_name, "idempotency_cleanup_database_main", BGW_MAXLEN);
    snprintf(worker.bgw_name, BGW_MAXLEN, "idempotency cleanup of database %u", database);
    strlcpy(worker.bgw_type, kWorkerType, BGW_MAXLEN);
    worker.bgw_main_arg = ObjectIdGetDatum(database);
    worker.bgw_notify_pid = MyProcPid;  // our latch is set when it starts and stops

    BackgroundWorkerHandle* handle = nullptr;
    MemoryContext old = MemoryContextSwitchTo(state.context);
    bool registered = RegisterDynamicBackgroundWorker(&worker, &handle);
    MemoryContextSwitchTo(old);
    if (!registered) {
      ereport(DEBUG1, (errmsg("idempotency cleanup: no free background worker slot, "
                              "retrying in %ld ms",
                              kRetryMs)));
      return false;
    }
    state.running[state.running_count++] = {database, handle};
    state.pending_next++;
  }
  return true;
}

void launcher_main() {
  pqsignal(SIGHUP, SignalHandlerForConfigReload);
  pqsignal(SIGTERM, die);
  BackgroundWorkerUnblockSignals();
  // No database: only shared catalogs (pg_database) are read.
  BackgroundWorkerInitializeConnection(nullptr, nullptr, 0);
  pgstat_report_appname(kLauncherType);
  ereport(LOG, (errmsg("idempotency cleanup launcher started")));

  LauncherState state;
  memset(&state, 0, sizeof state);
  state.context =
      AllocSetContextCreate(TopMemoryContext, "idempotency launcher", ALLOCSET_DEFAULT_SIZES);
  TimestampTz last_round = 0;

  for (;;) {
    CHECK_FOR_INTERRUPTS();  // SIGTERM (die) ends the process here
    if (ConfigReloadPending) {
      ConfigReloadPending = false;
      ProcessConfigFile(PGC_SIGHUP);
    }
    reap(state);

    // Read every time: a reload changes the interval of the round already waited for.
    const int64 interval_us = int64{gucs::cleanup_interval_ms} * 1000;
    TimestampTz now = GetCurrentTimestamp();
    // A hot standby has nothing to delete (it replays the primary's deletions); the
    // launcher starts only once recovery has finished, and this keeps it idle if ever not.
    if (!RecoveryInProgress() && (last_round == 0 || now - last_round >= interval_us)) {
      last_round = now;
      plan_round(state);
    }
    bool all_started = start_pending(state);

    int64 wait_us = last_round + interval_us - GetCurrentTimestamp();
    if (last_round == 0) wait_us = interval_us;
    if (!all_started) wait_us = std::min<int64>(wait_us, kRetryMs * 1000);
    long wait_ms = static_cast<long>(std::max<int64>(wait_us / 1000, 1));
    (void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, wait_ms,
                    PG_WAIT_EXTENSION);
    ResetLatch(MyLatch);
  }
}

// ---------------------------------------------------------------------------------------
// The database worker
// ---------------------------------------------------------------------------------------

// Runs `body(table)` in its own transaction with an SPI connection and a fresh snapshot, all
// released before returning (worker_spi's pattern). The installation is looked up and
// checked in every transaction (caller.hpp), and the body runs as its owner under
// SECURITY_RESTRICTED_OPERATION: the worker itself is the bootstrap superuser, and no
// statement of a round may run as that. False when the extension is not installed.
template <typename Body>
bool as_owner_in_transaction(const char* activity, Body&& body) {
  pg_call([&] {
    SetCurrentStatementStartTimestamp();
    StartTransactionCommand();
    PushActiveSnapshot(GetTransactionSnapshot());
    pgstat_report_activity(STATE_RUNNING, activity);
  });
  std::optional<caller::Installation> installation = caller::of_database();
  if (installation) {
    caller::ActingAsOwner acting(*installation);
    pg_call([] {
      if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "SPI_connect failed");
    });
    body(installation->table);
    pg_call([] { SPI_finish(); });
  }
  pg_call([] {
    PopActiveSnapshot();
    CommitTransactionCommand();
    pgstat_report_activity(STATE_IDLE, nullptr);
  });
  return installation.has_value();
}

// The pause after a full batch, and a chance to stop.
void pause_after(bool full, TimestampTz batch_start) {
  // Between two full batches, a pause like vacuum's cost delay: deleting a backlog of
  // millions of keys takes CPU and writes WAL (a full-page image for every page touched
  // first after a checkpoint) that the sessions' commits would otherwise flush along
  // with their own. The pause is idempotency.cleanup_delay, or as long as the batch
  // took if that is longer: the worker works at most half of the time, and backs off
  // further when a busy server makes its batches slow.
  const int64 batch_ms = (GetCurrentTimestamp() - batch_start) / 1000;
  int delay_ms = 0;
  if (full && gucs::cleanup_delay_ms > 0)
    delay_ms =
        static_cast<int>(std::min<int64>(std::max<int64>(gucs::cleanup_delay_ms, batch_ms), 1000));
  pg_call([&] {
    if (delay_ms > 0) {
      (void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, delay_ms,
                      PG_WAIT_EXTENSION);
      ResetLatch(MyLatch);
    }
    CHECK_FOR_INTERRUPTS();
  });
}

// One round in the current database. Errors are caught, logged, recorded and end the
// round; the launcher starts the next one after the interval.
void run_round() noexcept {
  uint64 deleted = 0;
  bool installed = false;
  bool unfinished = false;
  TimestampTz resume_from = DT_NOBEGIN;
  std::string failure;
  try {
    if (RecoveryInProgress()) return;
    const int batch_size = gucs::cleanup_batch_size;
    // Keys that expire during the round are left to the next one: the round ends.
    const TimestampTz now = GetCurrentTimestamp();
    // Keys of dropped roles first (usually none: a few index descents).
    bool full = false;
    do {
      const TimestampTz batch_start = GetCurrentTimestamp();
      cleanup::Batch orphans;
      installed = as_owner_in_transaction(
          "idempotency cleanup: deleting keys of dropped roles",
          [&](Oid table) { orphans = cleanup::delete_orphans(table, batch_size); });
      if (!installed) return;
      deleted += orphans.deleted;
      full = orphans.full;
      pause_after(full, batch_start);
    } while (full && GetCurrentTimestamp() - now < kRoundMicroseconds);
    cleanup::Batch batch;
    // After an unfinished round, go on where it stopped instead of walking again over the
    // index entries of the keys it deleted (dead until VACUUM).
    batch.last_expiry = stats::resume_point(MyDatabaseId);
    // With the dropped roles' keys done, the expired ones.
    if (!full) {
      do {
        const TimestampTz batch_start = GetCurrentTimestamp();
        installed = as_owner_in_transaction(
            "idempotency cleanup: deleting a batch of expired keys", [&](Oid table) {
              batch = cleanup::delete_batch(table, now, batch.last_expiry, batch_size);
            });
        if (!installed) return;
        deleted += batch.deleted;
        full = batch.full;
        pause_after(full, batch_start);
      } while (full && GetCurrentTimestamp() - now < kRoundMicroseconds);
    }
    unfinished = full;
    resume_from = batch.last_expiry;
  } catch (PgError& e) {
    failure = e.what();
    ErrorData* error = e.release();
    // Logged with its own SQLSTATE, detail and hint, as a LOG: the round is over, the
    // process is not.
    error->elevel = LOG;
    error->output_to_client = false;
    try {
      pg_call([&] {
        error->message = psprintf("idempotency cleanup of database %u failed: %s", MyDatabaseId,
                                  error->message != nullptr ? error->message : "?");
        ThrowErrorData(error);
      });
    } catch (...) {
    }
  } catch (const std::exception& e) {
    failure = e.what();
    try {
      pg_call([&] {
        ereport(LOG, (errmsg("idempotency cleanup of database %u failed: %s", MyDatabaseId,
                             failure.c_str())));
      });
    } catch (...) {
    }
  }
  if (!failure.empty()) {
    try {
      pg_call([] {
        // Leaves the failed transaction (and its SPI connection and snapshot).
        AbortCurrentTransaction();
        pgstat_report_activity(STATE_IDLE, nullptr);
      });
    } catch (...) {
    }
  }
  if (installed || !failure.empty())
    stats::record_cleanup(MyDatabaseId, deleted, failure.empty() ? nullptr : failure.c_str(),
                          unfinished, resume_from);
  if (deleted > 0)
    ereport(DEBUG1,
            (errmsg("idempotency cleanup deleted " UINT64_FORMAT " expired keys", deleted)));
}

void database_main(Oid database) {
  pqsignal(SIGHUP, SignalHandlerForConfigReload);
  pqsignal(SIGTERM, die);
  BackgroundWorkerUnblockSignals();
  // Runs as the bootstrap superuser; exits with FATAL if the database was dropped since
  // the launcher read pg_database (and is then not restarted).
  BackgroundWorkerInitializeConnectionByOid(database, InvalidOid, 0);
  pgstat_report_appname(kWorkerType);
  // Cleanup is background work: on a busy server the scheduler favours the sessions that
  // claim keys. (The worker shares no row or index page lock with claims: it deletes rows
  // of past expiry, claims insert rows of future expiry; a deletion writes no index entry.)
  // On an idle server it still gets a whole core.
  if (setpriority(PRIO_PROCESS, 0, kWorkerNice) != 0)
    ereport(DEBUG1, (errmsg_internal("idempotency cleanup: setpriority failed: %m")));
  run_round();
}

}  // namespace

void register_launcher() {
  BackgroundWorker worker;
  memset(&worker, 0, sizeof worker);
  worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
  worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
  worker.bgw_restart_time = kLauncherRestartSeconds;
  strlcpy(worker.bgw_library_name, kLibrary, BGW_MAXLEN);
  strlcpy(worker.bgw_function_name, "idempotency_cleanup_launcher_main", BGW_MAXLEN);
  strlcpy(worker.bgw_name, kLauncherType, BGW_MAXLEN);
  strlcpy(worker.bgw_type, kLauncherType, BGW_MAXLEN);
  worker.bgw_main_arg = static_cast<Datum>(0);
  worker.bgw_notify_pid = 0;
  RegisterBackgroundWorker(&worker);
}

}  // namespace idem::cleanup_worker

// Entry points named in the worker registrations. No C++ exception can leave them: the
// launcher uses no throwing code, and the round catches everything.
void idempotency_cleanup_launcher_main(Datum) {
  idem::cleanup_worker::launcher_main();
}

void idempotency_cleanup_database_main(Datum argument) {
  idem::cleanup_worker::database_main(DatumGetObjectId(argument));
}
