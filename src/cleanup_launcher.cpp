// The cleanup launcher (SPEC §5), registered at server start by shared_preload_libraries.
// It connects to no database (so it never stands in the way of DROP DATABASE), reads
// pg_database every idempotency.cleanup_interval and starts one short-lived database worker
// (cleanup_worker.cpp) per database it serves.
//
// The registry in shared memory (cleanup_shared.hpp) names the database of every worker
// starting or running: the launcher never starts a second one for a database, also after it
// was started again itself. A database found without the extension costs nothing more: the
// launcher looks again only after a CREATE EXTENSION idempotency somewhere, or after a slow
// back-off. A full max_worker_processes pool is a WARNING (once a minute) and counted in
// idempotency_stats.worker_start_failures.
//
// Signals: SIGTERM stops the launcher quietly (exit 0: a shutdown logs nothing above LOG,
// and a launcher stopped by pg_terminate_backend() stays stopped until the next server
// start); SIGINT (pg_cancel_backend) makes it start again after kLauncherRestartSeconds
// (exit 1), its database workers keeping on; SIGHUP reloads.
//
// The launcher keeps no C++ object with a destructor in frames that PostgreSQL may longjmp
// over: its ERROR/FATAL paths end the process.
#include "cleanup_shared.hpp"
#include "cleanup_worker.hpp"
#include "gucs.hpp"
#include "stats.hpp"

extern "C" {
PGDLLEXPORT void idempotency_cleanup_launcher_main(Datum argument);
}

namespace idem::cleanup_worker {
namespace {

constexpr const char* kLauncherType = "idempotency cleanup launcher";
// After a failed registration (no free worker slot), try again this much later.
constexpr long kRetryMs = 1000;
// At most one WARNING about a full worker pool per this many milliseconds.
constexpr int64 kWarningIntervalMs = 60 * 1000;
// Seconds before the postmaster starts the launcher again when it exits with an error.
constexpr int kLauncherRestartSeconds = 1;
// A registration that a previous launcher made and whose worker has not started after this
// long never will (the postmaster could not fork it): the entry is freed.
constexpr int64 kStartTimeoutMicroseconds = 10 * 1000 * 1000;
// A database found without the extension is looked at again after this back-off (doubled
// each time, up to kMaxBackoff), or at once after a CREATE EXTENSION idempotency.
constexpr int64 kFirstBackoffMicroseconds = int64{5} * 60 * 1000 * 1000;
constexpr int64 kMaxBackoffMicroseconds = int64{60} * 60 * 1000 * 1000;

volatile sig_atomic_t stop_requested = false;
volatile sig_atomic_t restart_requested = false;

void launcher_sigterm(SIGNAL_ARGS) {
  const int saved_errno = errno;
  stop_requested = true;
  SetLatch(MyLatch);
  errno = saved_errno;
}

void launcher_sigint(SIGNAL_ARGS) {
  const int saved_errno = errno;
  restart_requested = true;
  SetLatch(MyLatch);
  errno = saved_errno;
}

// A database the launcher found without the extension.
struct Absent {
  Oid database;
  TimestampTz next_look;
  int64 backoff_us;
};

struct LauncherState {
  MemoryContext context;  // what follows lives here, across transactions
  BackgroundWorkerHandle* handles[cleanup_shared::kMaxWorkers];  // of the entries we reserved
  Oid* pending;  // databases of the current round not started yet
  int pending_capacity;
  int pending_count;
  int pending_next;
  Absent* absent;
  int absent_count;
  int absent_capacity;
  uint64 extension_generation;  // at the last look at the absent databases
  TimestampTz last_warning;     // of a full worker pool
  int failures_since_warning;
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

// Grows `array` (of `capacity` elements of `size` bytes) in the launcher's context.
// pg-frame: the launcher, a bgworker main; it owns no C++ object (its state is plain data).
void* grown(LauncherState& state, void* array, int* capacity, size_t size) {
  const int wanted = *capacity == 0 ? 16 : *capacity * 2;
  MemoryContext old = MemoryContextSwitchTo(state.context);
  void* result = array == nullptr ? palloc(wanted * size) : repalloc(array, wanted * size);
  MemoryContextSwitchTo(old);
  *capacity = wanted;
  return result;
}

Absent* find_absent(LauncherState& state, Oid database) {
  for (int i = 0; i < state.absent_count; ++i)
    if (state.absent[i].database == database) return &state.absent[i];
  return nullptr;
}

void forget_absent(LauncherState& state, Oid database) {
  for (int i = 0; i < state.absent_count; ++i) {
    if (state.absent[i].database != database) continue;
    state.absent[i] = state.absent[--state.absent_count];
    return;
  }
}

// The worker found no extension: look again after the back-off (doubled from the last).
void remember_absent(LauncherState& state, Oid database) {
  Absent* entry = find_absent(state, database);
  if (entry == nullptr) {
    if (state.absent_count == state.absent_capacity)
      state.absent =
          static_cast<Absent*>(grown(state, state.absent, &state.absent_capacity, sizeof(Absent)));
    entry = &state.absent[state.absent_count++];
    *entry = {database, 0, kFirstBackoffMicroseconds / 2};
  }
  entry->backoff_us = std::min(entry->backoff_us * 2, kMaxBackoffMicroseconds);
  entry->next_look = GetCurrentTimestamp() + entry->backoff_us;
}

// Adds a database to the pending list (once).
void push_pending(LauncherState& state, Oid database) {
  for (int i = state.pending_next; i < state.pending_count; ++i)
    if (state.pending[i] == database) return;
  if (state.pending_count == state.pending_capacity)
    state.pending =
        static_cast<Oid*>(grown(state, state.pending, &state.pending_capacity, sizeof(Oid)));
  state.pending[state.pending_count++] = database;
}

// A database that a failed DROP DATABASE left half dropped (datconnlimit -2, since 15.4 and
// its back-patches). Guarded on the symbol that came with it, not on the minor version: 15.0
// to 15.3 build too, and have no such state.
bool half_dropped(Form_pg_database database) {
#ifdef DATCONNLIMIT_INVALID_DB
  return database_is_invalid_form(database);
#else
  (void)database;
  return false;
#endif
}

// Reads pg_database (a shared catalog: no database connection needed) in a transaction
// that ends before this returns: the launcher holds no snapshot between rounds. Fills the
// pending list with the databases to serve, and forgets what it knew of dropped ones.
// pg-frame: the launcher, a bgworker main; it owns no C++ object (its state is plain data).
void plan_round(LauncherState& state) {
  SetCurrentStatementStartTimestamp();
  StartTransactionCommand();
  (void)GetTransactionSnapshot();
  pgstat_report_activity(STATE_RUNNING, "reading pg_database");
  // The transaction's start read the invalidation queue: after a reset, look at pg_authid.
  cleanup_shared::check_roles();

  // A CREATE EXTENSION idempotency committed somewhere: every absent database gets a look.
  const uint64 generation = cleanup_shared::extension_generation();
  if (generation != state.extension_generation) {
    state.extension_generation = generation;
    state.absent_count = 0;
  }
  const TimestampTz now = GetCurrentTimestamp();
  state.pending_count = 0;
  state.pending_next = 0;
  int existing_count = 0;
  int existing_capacity = 0;
  Oid* existing = nullptr;

  Relation relation = table_open(DatabaseRelationId, AccessShareLock);
  TableScanDesc scan = table_beginscan_catalog(relation, 0, nullptr);
  HeapTuple tuple;
  while ((tuple = heap_getnext(scan, ForwardScanDirection)) != nullptr) {
    auto* database = reinterpret_cast<Form_pg_database>(GETSTRUCT(tuple));
    if (existing_count == existing_capacity)
      existing = static_cast<Oid*>(grown(state, existing, &existing_capacity, sizeof(Oid)));
    existing[existing_count++] = database->oid;
    // Templates are skipped: a connection to template1 would make CREATE DATABASE fail.
    // So are databases that take no connections or are half dropped.
    if (database->datistemplate || !database->datallowconn || half_dropped(database)) continue;
    if (!served_by_setting(NameStr(database->datname))) continue;
    // At most one worker per database, whoever started it.
    if (cleanup_shared::serving(database->oid)) continue;
    const Absent* absent = find_absent(state, database->oid);
    if (absent != nullptr && now < absent->next_look) continue;
    push_pending(state, database->oid);
  }
  table_endscan(scan);
  table_close(relation, AccessShareLock);

  CommitTransactionCommand();
  stats::forget_dropped_databases(existing, existing_count);
  // Absent databases that were dropped are forgotten too.
  for (int i = 0; i < state.absent_count;) {
    bool exists = false;
    for (int j = 0; j < existing_count && !exists; ++j)
      exists = existing[j] == state.absent[i].database;
    if (exists)
      ++i;
    else
      state.absent[i] = state.absent[--state.absent_count];
  }
  if (existing != nullptr) pfree(existing);
  pgstat_report_activity(STATE_IDLE, nullptr);
}

// Frees the registry entries of workers that have exited (or never started) and acts on how
// their rounds ended. True while an entry of a previous launcher is still starting: the
// launcher is not told when that one ends and looks again soon.
// pg-frame: the launcher, a bgworker main; it owns no C++ object (its state is plain data).
bool reap(LauncherState& state) {
  bool waiting_for_unknown = false;
  const TimestampTz now = GetCurrentTimestamp();
  for (int i = 0; i < cleanup_shared::kMaxWorkers; ++i) {
    const cleanup_shared::Entry entry = cleanup_shared::entry(i);
    if (entry.database == InvalidOid) continue;
    BackgroundWorkerHandle* handle = state.handles[i];
    bool gone = entry.exited;
    if (!gone && handle != nullptr) {
      pid_t pid;
      // Stopped without having exited through the registry: it never ran (or ran someone
      // else's registration).
      gone = GetBackgroundWorkerPid(handle, &pid) == BGWH_STOPPED && entry.pid == 0;
    }
    if (!gone && handle == nullptr && entry.pid == 0) {
      gone = now - entry.reserved_at > kStartTimeoutMicroseconds;
      waiting_for_unknown = waiting_for_unknown || !gone;
    }
    if (!gone) continue;
    if (handle != nullptr) pfree(handle);
    state.handles[i] = nullptr;
    cleanup_shared::release(i);
    switch (entry.outcome) {
      case cleanup_shared::Outcome::kNotInstalled:
        remember_absent(state, entry.database);
        break;
      case cleanup_shared::Outcome::kUnfinished:
        // Expired keys are left: the next round at once.
        forget_absent(state, entry.database);
        push_pending(state, entry.database);
        break;
      default:
        forget_absent(state, entry.database);
        break;
    }
  }
  return waiting_for_unknown;
}

// The pool is full: counted for every database that waits for a worker, and a WARNING at
// most once a minute.
// pg-frame: the launcher, a bgworker main; it owns no C++ object (its state is plain data).
void start_failed(LauncherState& state) {
  for (int i = state.pending_next; i < state.pending_count; ++i)
    stats::count_start_failure(state.pending[i]);
  ++state.failures_since_warning;
  const TimestampTz now = GetCurrentTimestamp();
  if (state.last_warning != 0 && now - state.last_warning < kWarningIntervalMs * 1000) return;
  ereport(WARNING,
          (errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
           errmsg("idempotency cleanup: no free background worker slot to clean database %u",
                  state.pending[state.pending_next]),
           errdetail("%d start(s) failed since the last warning, %d database(s) wait; "
                     "max_worker_processes is %d.",
                     state.failures_since_warning, state.pending_count - state.pending_next,
                     max_worker_processes),
           errhint("Raise max_worker_processes: the cleanup uses up to %d at a time. Failures "
                   "are counted in idempotency_stats.worker_start_failures.",
                   cleanup_shared::kMaxWorkers)));
  state.last_warning = now;
  state.failures_since_warning = 0;
}

// Starts workers for pending databases while registry entries allow; false when a
// registration failed (every max_worker_processes slot is taken) and should be retried soon.
// pg-frame: the launcher, a bgworker main; it owns no C++ object (its state is plain data).
bool start_pending(LauncherState& state) {
  while (state.pending_next < state.pending_count) {
    const Oid database = state.pending[state.pending_next];
    if (cleanup_shared::serving(database)) {
      state.pending_next++;
      continue;
    }
    Registration registration{database, 0};
    const int index = cleanup_shared::reserve(database, &registration.ticket);
    if (index < 0) return true;  // kMaxWorkers run: the next one starts when one ends
    BackgroundWorker worker;
    memset(&worker, 0, sizeof worker);
    worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
    worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
    worker.bgw_restart_time = BGW_NEVER_RESTART;  // the next round is the retry
    strlcpy(worker.bgw_library_name, kLibrary, BGW_MAXLEN);
    strlcpy(worker.bgw_function_name, kDatabaseMain, BGW_MAXLEN);
    snprintf(worker.bgw_name, BGW_MAXLEN, "idempotency cleanup of database %u", database);
    strlcpy(worker.bgw_type, kWorkerType, BGW_MAXLEN);
    worker.bgw_main_arg = Int32GetDatum(index);
    memcpy(worker.bgw_extra, &registration, sizeof registration);
    worker.bgw_notify_pid = MyProcPid;  // our latch is set when it starts and stops

    BackgroundWorkerHandle* handle = nullptr;
    MemoryContext old = MemoryContextSwitchTo(state.context);
    const bool registered = RegisterDynamicBackgroundWorker(&worker, &handle);
    MemoryContextSwitchTo(old);
    if (!registered) {
      cleanup_shared::release(index);
      start_failed(state);
      return false;
    }
    state.handles[index] = handle;
    state.pending_next++;
  }
  return true;
}

// The launcher's loop: a round of workers every interval, until SIGTERM.
// pg-frame: the launcher, a bgworker main; it owns no C++ object (its state is plain data).
void launcher_main() {
  pqsignal(SIGHUP, SignalHandlerForConfigReload);
  pqsignal(SIGTERM, launcher_sigterm);
  pqsignal(SIGINT, launcher_sigint);
  BackgroundWorkerUnblockSignals();
  // No database: only shared catalogs (pg_database) are read.
  BackgroundWorkerInitializeConnection(nullptr, nullptr, 0);
  pgstat_report_appname(kLauncherType);
  cleanup_shared::become_launcher();
  ereport(LOG, (errmsg("idempotency cleanup launcher started")));

  LauncherState state;
  memset(&state, 0, sizeof state);
  state.context =
      AllocSetContextCreate(TopMemoryContext, "idempotency launcher", ALLOCSET_DEFAULT_SIZES);
  state.extension_generation = cleanup_shared::extension_generation();
  TimestampTz last_round = 0;

  for (;;) {
    if (stop_requested) {
      ereport(LOG, (errmsg("idempotency cleanup launcher stopping")));
      proc_exit(0);
    }
    if (restart_requested) {
      ereport(LOG, (errmsg("idempotency cleanup launcher restarting on request"),
                    errdetail("It starts again in %d seconds; its workers keep running.",
                              kLauncherRestartSeconds)));
      proc_exit(1);
    }
    CHECK_FOR_INTERRUPTS();
    if (ConfigReloadPending) {
      ConfigReloadPending = false;
      ProcessConfigFile(PGC_SIGHUP);
    }
    const bool waiting_for_unknown = reap(state);

    // Read every time: a reload changes the interval of the round already waited for.
    const int64 interval_us = int64{gucs::cleanup_interval_ms} * 1000;
    TimestampTz now = GetCurrentTimestamp();
    // A hot standby has nothing to delete (it replays the primary's deletions); the
    // launcher starts only once recovery has finished, and this keeps it idle if ever not.
    // With idempotency.cleanup_worker = off for the whole server, no round either.
    if (!RecoveryInProgress() && gucs::cleanup_worker &&
        (last_round == 0 || now - last_round >= interval_us)) {
      last_round = now;
      plan_round(state);
    }
    const bool all_started = start_pending(state);

    int64 wait_us = last_round + interval_us - GetCurrentTimestamp();
    if (last_round == 0) wait_us = interval_us;
    if (!all_started || waiting_for_unknown) wait_us = std::min<int64>(wait_us, kRetryMs * 1000);
    long wait_ms = static_cast<long>(std::max<int64>(wait_us / 1000, 1));
    (void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, wait_ms,
                    PG_WAIT_EXTENSION);
    ResetLatch(MyLatch);
  }
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

// The entry point named in the registration. No C++ exception can leave it: the launcher uses
// no throwing code.
void idempotency_cleanup_launcher_main(Datum) {
  idem::cleanup_worker::launcher_main();
}
