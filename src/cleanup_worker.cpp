// The cleanup database worker (SPEC §5), started by the launcher (cleanup_launcher.cpp) for
// one database. It connects and runs rounds of about a second: each looks for the extension,
// deletes expired keys and then keys of dropped roles (when a role may have gone) batch by
// batch, each batch its own transaction (cleanup.hpp), and records itself in
// idempotency_stats. While keys are left it runs the next round at once, for up to 10 s, then
// exits (the launcher starts the next process); it leaves between two rounds as soon as a
// command wants the database alone, so DROP DATABASE waits at most for one round. An error in
// a round is logged and recorded in the statistics; the worker exits normally and the next
// round tries again, so a persistent error never turns into a crash-restart loop.
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
#include "pg/locks.hpp"
#include "stats.hpp"
#include "worker_session.hpp"

extern "C" {
PGDLLEXPORT void idempotency_cleanup_database_main(Datum argument);
}

namespace idem::cleanup_worker {
namespace {

// A round stops after this much work (keys may be left), so that the order of its work holds
// every second: expired keys first, then the pass over keys of dropped roles with the time left.
constexpr int64 kRoundMicroseconds = 1000 * 1000;
// A process runs rounds one after another, while keys are left, for this long. Why not one
// process a round: a process's start and first batch (the connection, cold catalog caches,
// the statements planned anew) cost a burst of about 50 ms of CPU that no pause of the throttle
// spreads, and one such burst a second beside the claims set their tail (issue #39).
constexpr int64 kProcessMicroseconds = int64{10} * 1000 * 1000;

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

// What a process's rounds have used so far (log_round).
struct ProcessRounds {
  int rounds = 0;
  int64 cpu_us = 0;  // the process's CPU time at the end of its last round
};

// The round's summary at DEBUG1, with the process's CPU time since its last round's end (for
// its first round: since the process started). Called from a noexcept frame with C++ objects
// alive: a log line at most.
void log_round(const cleanup::Progress& progress, TimestampTz started,
               ProcessRounds& process) noexcept {
  const int64 cpu_now_us = cleanup::Throttle::cpu_now_us();
  ++process.rounds;
  char line[512];
  snprintf(line, sizeof line,
           "idempotency cleanup of database %u: round of %ld ms, " UINT64_FORMAT
           " keys deleted, orphan pass %s, peak memory %zu bytes, %d pauses of %ld ms "
           "in all, %ld ms on CPU in it (the first of a process: since its start), round %d of "
           "its process",
           MyDatabaseId, static_cast<long>((GetCurrentTimestamp() - started) / 1000),
           progress.deleted, progress.orphan_pass ? "yes" : "no", progress.peak_memory,
           progress.pauses, static_cast<long>(progress.paused_ms),
           static_cast<long>((cpu_now_us - process.cpu_us) / 1000), process.rounds);
  process.cpu_us = cpu_now_us;
  try {
    pg::errors::report(DEBUG1, line);
  } catch (...) {
  }
}

// One round in the current database. Errors are caught, logged, recorded and end the round;
// the launcher starts the next one after the interval.
cleanup_shared::Outcome run_round(ProcessRounds& process) noexcept {
  using cleanup_shared::Outcome;
  if (RecoveryInProgress()) return Outcome::kDone;
  const TimestampTz started = GetCurrentTimestamp();
  cleanup::Request request;
  request.batch_size = gucs::cleanup_batch_size;
  // Keys that expire during the round are left to the next one: the round ends.
  request.now = GetCurrentTimestamp();
  request.time_budget_us = kRoundMicroseconds;
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
  if (progress.installed) log_round(progress, started, process);
  if (!failure.empty()) return Outcome::kFailed;
  if (!progress.installed) return progress.paused ? Outcome::kPaused : Outcome::kNotInstalled;
  if (progress.paused) return Outcome::kPaused;
  if (stopped) return Outcome::kDone;  // the server stops: no next round to hurry
  return progress.unfinished ? Outcome::kUnfinished : Outcome::kDone;
}

// After a round that left keys: may the process run the next one? Not once it is asked to
// stop, nor while a command wants the database alone: DROP DATABASE, ALTER DATABASE RENAME or
// SET TABLESPACE, CREATE DATABASE copying it wait (up to 5 s) for the other connections to go.
bool may_run_another_round() noexcept {
  try {
    return !worker_session::stop_requested() && !pg::locks::database_wanted_alone();
  } catch (...) {
    return false;
  }
}

// A database worker: connects, runs rounds while keys are left (for up to
// kProcessMicroseconds), records how the last one ended.
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
  ProcessRounds process;
  cleanup_shared::Outcome outcome = run_round(process);
  while (outcome == cleanup_shared::Outcome::kUnfinished &&
         GetCurrentTimestamp() - started < kProcessMicroseconds && may_run_another_round())
    outcome = run_round(process);
  cleanup_shared::set_outcome(outcome);
  if (outcome == cleanup_shared::Outcome::kNotInstalled)
    ereport(DEBUG1, (errmsg_internal("idempotency cleanup: database %u does not have the "
                                     "extension; looked at again after CREATE EXTENSION",
                                     MyDatabaseId)));
  else
    ereport(DEBUG1,
            (errmsg_internal("idempotency cleanup of database %u: the process's rounds took %ld ms",
                             MyDatabaseId,
                             static_cast<long>((GetCurrentTimestamp() - started) / 1000))));
}

}  // namespace

}  // namespace idem::cleanup_worker

// The entry point named in the registration. No C++ exception can leave it: the round
// catches everything.
void idempotency_cleanup_database_main(Datum argument) {
  idem::cleanup_worker::database_main(DatumGetInt32(argument));
}
