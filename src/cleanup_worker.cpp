// The cleanup database worker (SPEC §5), started by the launcher (cleanup_launcher.cpp) for
// one database. It connects, looks for the extension, deletes keys of dropped roles (when a
// role may have gone) and expired keys batch by batch, each batch its own transaction
// (cleanup.hpp), records the round in idempotency_stats and exits. A connected process lives
// only for one round, and leaves as soon as a batch ends when a command wants the database
// alone, so DROP DATABASE waits at most for one batch. An error in a round is
// logged and recorded in the statistics; the worker exits normally and the next round tries
// again, so a persistent error never turns into a crash-restart loop.
//
// Signals (worker_session.hpp): SIGTERM stops the worker quietly (exit 0); SIGHUP reloads.
//
// The worker's set-up keeps no C++ object with a destructor in frames that PostgreSQL may
// longjmp over: its ERROR/FATAL paths end the process. The round itself catches everything;
// every PostgreSQL call in it goes through pg_call().
#include "cleanup_worker.hpp"

#include "cleanup.hpp"
#include "cleanup_shared.hpp"
#include "cleanup_throttle.hpp"
#include "gucs.hpp"
#include "pg/errors.hpp"
#include "stats.hpp"
#include "worker_session.hpp"

extern "C" {
PGDLLEXPORT void idempotency_cleanup_database_main(Datum argument);
}

namespace idem::cleanup_worker {
namespace {

// A database worker stops after this much work and the launcher starts the next round at
// once. A round is long because a process's start and its first batch (the connection, the
// catalog caches, the plans) cost a burst of CPU that the throttle cannot pace: one start
// every 10 s instead of every second takes that burst off the claims' tail nearly ten times.
// The connection never stands in the way of a command that needs the database alone (DROP
// DATABASE, which waits up to 5 s for other connections to go, and the like): after every
// batch the worker looks whether one waits, and leaves at once (Request::leave_database).
constexpr int64 kRoundMicroseconds = int64{10} * 1000 * 1000;

// Logs a failed round as a LOG with its own SQLSTATE, detail and hint: the round is over,
// the process is not.
void log_failure(PgError& e) {
  ErrorData* error = e.release();
  char prefix[64];
  snprintf(prefix, sizeof prefix, "idempotency cleanup of database %u failed", MyDatabaseId);
  try {
    pg::errors::report_at_log(error, prefix);
  } catch (...) {
  }
}

// The round's summary at DEBUG1. Called from a noexcept frame with C++ objects alive: a log
// line at most.
void log_round(const cleanup::Progress& progress, TimestampTz started) noexcept {
  char line[512];
  snprintf(line, sizeof line,
           "idempotency cleanup of database %u: round of %ld ms, " UINT64_FORMAT
           " keys deleted, orphan pass %s, peak memory %zu bytes, %d pauses of %ld ms "
           "in all, %ld ms on CPU since the process started",
           MyDatabaseId, static_cast<long>((GetCurrentTimestamp() - started) / 1000),
           progress.deleted, progress.orphan_pass ? "yes" : "no", progress.peak_memory,
           progress.pauses, static_cast<long>(progress.paused_ms),
           static_cast<long>(cleanup::Throttle::cpu_now_us() / 1000));
  try {
    pg::errors::report(DEBUG1, line);
  } catch (...) {
  }
}

// One round in the current database. Errors are caught, logged, recorded and end the round;
// the launcher starts the next one after the interval.
cleanup_shared::Outcome run_round() noexcept {
  using cleanup_shared::Outcome;
  if (RecoveryInProgress()) return Outcome::kDone;
  const TimestampTz started = GetCurrentTimestamp();
  cleanup::Request request;
  request.batch_size = gucs::cleanup_batch_size;
  // Keys that expire during the round are left to the next one: the round ends.
  request.now = GetCurrentTimestamp();
  request.time_budget_us = kRoundMicroseconds;
  request.leave_database = true;
  request.obey_pause = true;
  request.resume = true;
  cleanup::Progress progress;
  std::string failure;
  bool stopped = false;
  try {
    worker_session::cancel_on_stop();
    cleanup::run(request, progress);
  } catch (PgError& e) {
    // SIGTERM cancels the statement under way: a stop, not a failure.
    stopped = worker_session::stop_requested();
    failure = stopped ? std::string() : std::string(e.what());
    if (!stopped) log_failure(e);
  } catch (const std::exception& e) {
    failure = e.what();
    try {
      std::string line =
          "idempotency cleanup of database " + std::to_string(MyDatabaseId) + " failed: " + failure;
      pg::errors::report(LOG, line.c_str());
    } catch (...) {
    }
  }
  if (stopped || !failure.empty()) cleanup::abort_failed_batch();
  stopped = stopped || worker_session::stop_requested();
  const bool recorded =
      !failure.empty() || (progress.installed && (!progress.paused || progress.deleted > 0));
  if (recorded)
    stats::record_cleanup(
        MyDatabaseId, progress.deleted, failure.empty() ? nullptr : failure.c_str(),
        progress.unfinished ? stats::Resume{progress.resume_from, progress.resume_block}
                            : stats::Resume{});
  if (progress.installed) log_round(progress, started);
  if (!failure.empty()) return Outcome::kFailed;
  if (!progress.installed) return progress.paused ? Outcome::kPaused : Outcome::kNotInstalled;
  if (progress.paused) return Outcome::kPaused;
  if (stopped) return Outcome::kDone;  // the server stops: no next round to hurry
  return progress.unfinished ? Outcome::kUnfinished : Outcome::kDone;
}

// A database worker: connects, runs one round, records how it ended.
// pg-frame: a bgworker main; it owns no C++ object (the round's live in run_round, noexcept).
void database_main(int index) {
  Registration registration;
  memcpy(&registration, MyBgworkerEntry->bgw_extra, sizeof registration);
  worker_session::handle_signals();
  // A registration the launcher has given up on (it was started again meanwhile and found
  // this one too late): another worker may serve the database by now.
  if (!cleanup_shared::take(index, registration.database, registration.ticket)) return;
  worker_session::prepare_settings();
  // Runs as the bootstrap superuser; exits with FATAL if the database was dropped since
  // the launcher read pg_database (and is then not restarted). The worker runs at the
  // server's priority: a batch holds buffer and WAL locks that claims wait for.
  BackgroundWorkerInitializeConnectionByOid(registration.database, InvalidOid, 0);
  worker_session::undo_database_settings();
  pgstat_report_appname(kWorkerType);
  const TimestampTz started = GetCurrentTimestamp();
  const cleanup_shared::Outcome outcome = run_round();
  cleanup_shared::set_outcome(outcome);
  if (outcome == cleanup_shared::Outcome::kNotInstalled)
    ereport(DEBUG1, (errmsg_internal("idempotency cleanup: database %u does not have the "
                                     "extension; looked at again after CREATE EXTENSION",
                                     MyDatabaseId)));
  else
    ereport(DEBUG1,
            (errmsg_internal("idempotency cleanup of database %u: round of %ld ms", MyDatabaseId,
                             static_cast<long>((GetCurrentTimestamp() - started) / 1000))));
}

}  // namespace

}  // namespace idem::cleanup_worker

// The entry point named in the registration. No C++ exception can leave it: the round
// catches everything.
void idempotency_cleanup_database_main(Datum argument) {
  idem::cleanup_worker::database_main(DatumGetInt32(argument));
}
