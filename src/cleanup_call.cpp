// idempotency_cleanup(batch_size): deletes expired keys (and keys of dropped roles) now,
// for servers without the background worker (pg_cron, a janitor role's job).
//
// The deletions run in a dynamic background worker of their own, batch by batch, each batch
// committed there (cleanup.hpp), and the function waits for it and returns its count. The
// caller's transaction takes no lock on any key, so however long it stays open afterwards,
// and at whatever isolation level, it blocks nobody's claim (run inside the caller's
// transaction, every deleted row stayed locked until that transaction ended, and a claim of
// such an expired key answered in_progress meanwhile). It follows that the function sees
// only committed keys, that its deletions stay even if the calling transaction rolls back,
// and that it needs a free max_worker_processes slot while it runs (53400 when none is).
// The request and the result travel through a dynamic shared memory segment, so all of this
// works without shared_preload_libraries too; there is no role generation then, and every
// call makes the pass over keys of dropped roles.
//
// A cancel, a statement_timeout or a termination of the caller reaches the worker: the
// caller asks it to stop (SIGTERM) before it raises the error, and a worker whose caller is
// gone stops after its current batch.
#include "caller.hpp"
#include "cleanup.hpp"
#include "gucs.hpp"
#include "pg/errors.hpp"
#include "pg/transactions.hpp"
#include "pg/waits.hpp"
#include "pg/workers.hpp"
#include "pg_boundary.hpp"
#include "stats.hpp"
#include "worker_session.hpp"

extern "C" {
PGDLLEXPORT void idempotency_cleanup_call_main(Datum argument);
}

namespace idem::cleanup_call {
namespace {

constexpr const char* kWorkerType = "idempotency cleanup call";

// The segment's contents: the request, then the result the worker writes before it exits.
struct Call {
  Oid database;
  Oid table;
  int batch_size;
  TimestampTz now;
  pid_t requester;
  bool finished;  // the worker wrote a result
  uint64 deleted;
  int sqlstate;  // 0: success
  char message[1024];
  char detail[1024];
  char hint[512];
};

// The batch size asked for, checked: the argument, or idempotency.cleanup_batch_size.
int batch_size_of(FunctionCallInfo fcinfo) {
  const int batch_size = PG_ARGISNULL(0) ? gucs::cleanup_batch_size : PG_GETARG_INT32(0);
  if (batch_size <= 0)
    throw Error(ERRCODE_INVALID_PARAMETER_VALUE, "batch_size must be positive",
                "batch_size is " + std::to_string(batch_size) + ".",
                "Pass NULL to use idempotency.cleanup_batch_size.");
  return batch_size;
}

// Registers the worker that runs the call described in `segment`; 53400 when no
// max_worker_processes slot is free.
BackgroundWorkerHandle* start_worker(dsm_segment* segment) {
  BackgroundWorker worker;
  memset(&worker, 0, sizeof worker);
  worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
  worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
  worker.bgw_restart_time = BGW_NEVER_RESTART;
  strlcpy(worker.bgw_library_name, "idempotency", BGW_MAXLEN);
  strlcpy(worker.bgw_function_name, "idempotency_cleanup_call_main", BGW_MAXLEN);
  snprintf(worker.bgw_name, BGW_MAXLEN, "idempotency_cleanup() of backend %d", MyProcPid);
  strlcpy(worker.bgw_type, kWorkerType, BGW_MAXLEN);
  worker.bgw_main_arg = UInt32GetDatum(dsm_segment_handle(segment));
  worker.bgw_notify_pid = MyProcPid;  // our latch is set when it starts and stops
  BackgroundWorkerHandle* handle = nullptr;
  if (!pg::workers::start(&worker, &handle)) {
    stats::count_start_failure(MyDatabaseId);
    throw Error(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
                "idempotency_cleanup() found no free background worker slot",
                "The deletions run in a background worker of their own; all "
                "max_worker_processes slots are in use.",
                "Call it again later, or raise max_worker_processes.");
  }
  return handle;
}

// Waits until the worker has stopped. Cancelled or timed out meanwhile, it asks the worker to
// stop (at its next interrupt check) and lets the error go on to the caller.
void wait_for(BackgroundWorkerHandle* handle) {
  try {
    for (;;) {
      pid_t pid = 0;
      const BgwHandleStatus status = pg::workers::status(handle, &pid);
      if (status == BGWH_STOPPED) break;
      if (status == BGWH_POSTMASTER_DIED)
        throw Error(ERRCODE_ADMIN_SHUTDOWN, "the postmaster died during idempotency_cleanup()");
      // Woken when the worker starts and stops; the timeout only guards against a lost wake.
      pg::waits::on_latch(1000);
    }
  } catch (...) {
    try {
      pg::workers::stop(handle);
    } catch (...) {
    }
    throw;
  }
}

// The count the worker left in the segment, or its error raised here.
Datum result_of(const Call& result) {
  if (!result.finished)
    throw Error(ERRCODE_INTERNAL_ERROR,
                "the background worker of idempotency_cleanup() stopped "
                "without a result",
                {}, "The server log tells why.");
  if (result.sqlstate != 0)
    throw Error(result.sqlstate, result.message,
                result.detail[0] != '\0' ? std::string(result.detail)
                                         : std::string("Raised in the background worker that runs "
                                                       "the deletions of idempotency_cleanup()."),
                result.hint);
  return Int64GetDatum(static_cast<int64>(result.deleted));
}

Datum sql_cleanup(FunctionCallInfo fcinfo) {
  (void)caller::calling_role("idempotency_cleanup");
  const int batch_size = batch_size_of(fcinfo);
  const caller::Installation installation = caller::of_function(fcinfo->flinfo->fn_oid);
  // Deleting is a write: refused where a DELETE of the caller's would be (25006).
  pg::transactions::refuse_if_read_only("idempotency_cleanup()");

  dsm_segment* segment = pg::workers::new_segment(sizeof(Call));
  auto* call = static_cast<Call*>(dsm_segment_address(segment));
  memset(call, 0, sizeof *call);
  call->database = MyDatabaseId;
  call->table = installation.table;
  call->batch_size = batch_size;
  call->now = GetCurrentTimestamp();
  call->requester = MyProcPid;
  wait_for(start_worker(segment));
  pg_memory_barrier();
  const Call result = *call;
  pg::workers::detach(segment);
  return result_of(result);
}

// Copies an error into the segment for the caller to raise.
void store_error(Call* call, int sqlstate, const char* message, const char* detail,
                 const char* hint) {
  call->sqlstate = sqlstate;
  strlcpy(call->message, message != nullptr ? message : "unknown error", sizeof call->message);
  strlcpy(call->detail, detail != nullptr ? detail : "", sizeof call->detail);
  strlcpy(call->hint, hint != nullptr ? hint : "", sizeof call->hint);
}

// The call, run in the worker once connected: the deletions until none are left (or its
// caller is gone, or it is asked to stop), and the result left in `call`. Nothing may be
// thrown out of it.
void run_call(Call* call) noexcept {
  cleanup::Request request;
  request.batch_size = call->batch_size;
  request.now = call->now;
  request.table = call->table;
  request.requester = call->requester;
  cleanup::Progress progress;
  std::string failure;
  const TimestampTz started = GetCurrentTimestamp();
  try {
    worker_session::cancel_on_stop();
    cleanup::run(request, progress);
  } catch (PgError& e) {
    ErrorData* error = e.release();
    store_error(call, error->sqlerrcode, error->message, error->detail, error->hint);
    failure = call->message;
  } catch (const Error& e) {
    store_error(call, e.sqlstate(), e.what(), e.detail().c_str(), e.hint().c_str());
    failure = call->message;
  } catch (const std::exception& e) {
    store_error(call, ERRCODE_INTERNAL_ERROR, e.what(), nullptr, nullptr);
    failure = call->message;
  }
  if (!failure.empty()) cleanup::abort_failed_batch();
  // A run stopped because its caller went away is not a cleanup run of its own.
  if ((progress.installed || !failure.empty()) && !worker_session::stop_requested())
    stats::record_cleanup(MyDatabaseId, progress.deleted,
                          failure.empty() ? nullptr : failure.c_str());
  // `failure` is alive, and nothing may be thrown out of this frame: a log line at most.
  char line[512];
  snprintf(line, sizeof line,
           "idempotency_cleanup() of backend %d: %ld ms, " UINT64_FORMAT
           " keys deleted, orphan pass %s, peak memory %zu bytes, %d pauses of %ld ms in all",
           static_cast<int>(call->requester),
           static_cast<long>((GetCurrentTimestamp() - started) / 1000), progress.deleted,
           progress.orphan_pass ? "yes" : "no", progress.peak_memory, progress.pauses,
           static_cast<long>(progress.paused_ms));
  try {
    pg::errors::report(DEBUG1, line);
  } catch (...) {
  }
  call->deleted = progress.deleted;
  pg_write_barrier();
  call->finished = true;
}

// The worker: connects to the caller's database, runs the call (run_call) and detaches.
// pg-frame: a bgworker main; it owns no C++ object (the call's live in run_call, noexcept).
void call_main(dsm_handle handle) {
  worker_session::handle_signals();
  dsm_segment* segment = dsm_attach(handle);
  if (segment == nullptr) return;  // the caller is gone already
  auto* call = static_cast<Call*>(dsm_segment_address(segment));
  worker_session::prepare_settings();
  // The caller is connected, so the database takes connections or the caller is a superuser
  // who may connect anyway: the worker serves it either way. No C++ object exists yet, and a
  // wrapper here would throw into the C entry point: a raise ends the worker.
  BackgroundWorkerInitializeConnectionByOid(call->database, InvalidOid, BGWORKER_BYPASS_ALLOWCONN);
  worker_session::undo_database_settings();
  pgstat_report_appname("idempotency_cleanup()");
  run_call(call);
  dsm_detach(segment);
}

}  // namespace
}  // namespace idem::cleanup_call

IDEM_SQL_FUNCTION(idempotency_cleanup, idem::cleanup_call::sql_cleanup)

// The entry point named in the registration. No C++ exception can leave it: the run
// catches everything.
void idempotency_cleanup_call_main(Datum argument) {
  idem::cleanup_call::call_main(DatumGetUInt32(argument));
}
