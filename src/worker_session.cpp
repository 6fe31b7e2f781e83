// The session of a cleanup worker process (worker_session.hpp). Runs before and right after
// the worker connects, where an error ends the process (FATAL): no C++ object with a
// destructor lives here.
#include "worker_session.hpp"

namespace idem::worker_session {
namespace {

volatile sig_atomic_t stop = false;
volatile sig_atomic_t cancel_armed = false;

// SIGTERM: stop. Once the round's error handling is in place (cancel_on_stop), the cancel
// makes a statement under way fail at its next interrupt check (a row, a page, a lock wait)
// instead of running to its end. Before that (while connecting), a cancel would be an ERROR
// that ends the process with exit code 1 and a logged error: the flag alone stops it.
void on_sigterm(SIGNAL_ARGS) {
  const int saved_errno = errno;
  stop = true;
  if (cancel_armed) {
    InterruptPending = true;
    QueryCancelPending = true;
  }
  SetLatch(MyLatch);
  errno = saved_errno;
}

struct Pin {
  const char* name;
  const char* value;
};

// Values in the parameters' base units (milliseconds).
static_assert(kLockTimeoutMs == 1000 && kBatchTimeoutMs == 10000, "the pins below spell these");
constexpr Pin kPins[] = {
    {"default_transaction_isolation", "read committed"},
    {"default_transaction_read_only", "off"},
    {"default_transaction_deferrable", "off"},
    {"lock_timeout", "1000"},
    // Never armed in a background worker (arm_batch_deadline() is); pinned so that what a
    // worker shows is what it does.
    {"statement_timeout", "10000"},
    {"idle_in_transaction_session_timeout", "10000"},
#if PG_VERSION_NUM >= 170000
    {"transaction_timeout", "0"},
#endif
    // A deletion of expired keys needs no standby's confirmation (a standby promoted without
    // it deletes the keys again): a commit never waits for one that is slow or gone.
    {"synchronous_commit", "local"},
    // Under a BRIN the first batch of a run takes the first expired keys in block order and the
    // next batch goes on from the last block it deleted in (cleanup_statements.cpp): a
    // sequential scan joining another one mid-table would break that order.
    {"synchronize_seqscans", "off"},
};

bool pinned(const char* name) {
  for (const Pin& pin : kPins)
    if (strcmp(pin.name, name) == 0) return true;
  return false;
}

// A parameter's value as the server started this worker with it.
struct Remembered {
  config_generic* parameter;
  char* value;
};
Remembered* remembered = nullptr;
int remembered_count = 0;

bool from_database_or_role(GucSource source) {
  return source == PGC_S_DATABASE || source == PGC_S_USER || source == PGC_S_DATABASE_USER;
}

}  // namespace

void handle_signals() {
  pqsignal(SIGTERM, on_sigterm);
  pqsignal(SIGHUP, SignalHandlerForConfigReload);
  // SIGINT stays PostgreSQL's statement cancel: the batch deadline sends it.
  BackgroundWorkerUnblockSignals();
}

bool stop_requested() {
  return stop;
}

void cancel_on_stop() {
  cancel_armed = true;
  // A SIGTERM that came while connecting: the round stops at its first interrupt check.
  if (stop) {
    InterruptPending = true;
    QueryCancelPending = true;
  }
}

// pg-frame: called by the worker mains before any C++ object of theirs exists.
void prepare_settings() {
  // PGC_S_OVERRIDE outranks the settings of databases and roles, which the connection
  // applies next: these hold while connecting and after.
  for (const Pin& pin : kPins) SetConfigOption(pin.name, pin.value, PGC_SUSET, PGC_S_OVERRIDE);

#if PG_VERSION_NUM >= 160000
  int count = 0;
  config_generic** parameters = get_guc_variables(&count);
#else
  config_generic** parameters = get_guc_variables();
  const int count = GetNumConfigOptions();
#endif
  MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);
  remembered = static_cast<Remembered*>(palloc(sizeof(Remembered) * (count > 0 ? count : 1)));
  remembered_count = 0;
  for (int i = 0; i < count; ++i) {
    config_generic* parameter = parameters[i];
    if (parameter->context != PGC_USERSET && parameter->context != PGC_SUSET) continue;
    if ((parameter->flags & GUC_CUSTOM_PLACEHOLDER) != 0 || pinned(parameter->name)) continue;
    // Per transaction, set from the defaults pinned above at every transaction start.
    if (strncmp(parameter->name, "transaction_", 12) == 0) continue;
    const char* value = GetConfigOption(parameter->name, false, false);
    remembered[remembered_count++] = {parameter, pstrdup(value != nullptr ? value : "")};
  }
  MemoryContextSwitchTo(old);
}

// pg-frame: called by the worker mains before any C++ object of theirs exists.
void undo_database_settings() {
  StartTransactionCommand();
  for (int i = 0; i < remembered_count; ++i) {
    config_generic* parameter = remembered[i].parameter;
    if (!from_database_or_role(parameter->source)) continue;
    const char* name = parameter->name;
    const char* value = remembered[i].value;
    ereport(DEBUG1, (errmsg_internal("idempotency cleanup: %s = '%s' of the database or role is "
                                     "not used, '%s' is",
                                     name, GetConfigOption(name, false, false), value)));
    // A value that a check refuses now is reported at LOG and left as it is.
    (void)set_config_option(name, value, PGC_SUSET, PGC_S_OVERRIDE, GUC_ACTION_SET, true, LOG,
                            false);
  }
  CommitTransactionCommand();
}

void arm_batch_deadline() {
  enable_timeout_after(STATEMENT_TIMEOUT, kBatchTimeoutMs);
}

void disarm_batch_deadline() {
  disable_timeout(STATEMENT_TIMEOUT, false);
}

}  // namespace idem::worker_session
