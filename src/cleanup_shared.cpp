// Shared state of the cleanup launcher, its workers and the sessions (cleanup_shared.hpp).
// Everything here is plain C-style code: it runs in hooks and callbacks of every backend and
// in exit callbacks, where no C++ object with a destructor may live.
#include "cleanup_shared.hpp"

#include "shared_memory.hpp"

namespace idem::cleanup_shared {
namespace {

struct Shared {
  pg_atomic_uint64 role_generation;
  pg_atomic_uint64 extension_generation;
  slock_t mutex;  // guards what follows
  PGPROC* launcher;
  uint64 next_ticket;
  Entry entries[kMaxWorkers];
};

Shared* shared = nullptr;
int my_entry = -1;  // the registry entry of this database worker

void initialize(Shared* state) {
  // Generations start at 1: a database whose pass has never run remembers 0.
  pg_atomic_init_u64(&state->role_generation, 1);
  pg_atomic_init_u64(&state->extension_generation, 1);
  SpinLockInit(&state->mutex);
  state->launcher = nullptr;
  state->next_ticket = 1;
  for (Entry& entry : state->entries) entry = Entry{};
}

// pg_authid changed (a role created, altered, renamed or dropped), or the caches were reset
// (hash value 0) and anything may have changed. Every backend that processes the
// invalidation bumps the counter: more bumps than events cost one extra pass at most.
void role_changed(Datum, SyscacheId, uint32) {
  if (shared != nullptr) pg_atomic_fetch_add_u64(&shared->role_generation, 1);
}

ProcessUtility_hook_type previous_utility = nullptr;
bool created_in_transaction = false;  // CREATE EXTENSION idempotency ran in this transaction
bool transaction_callback_registered = false;

// At commit the new installation is visible: the launcher may look at its database again.
void at_transaction_end(XactEvent event, void*) {
  if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_PARALLEL_COMMIT) {
    if (created_in_transaction && shared != nullptr) {
      pg_atomic_fetch_add_u64(&shared->extension_generation, 1);
      wake_launcher();
    }
    created_in_transaction = false;
  } else if (event == XACT_EVENT_ABORT || event == XACT_EVENT_PARALLEL_ABORT) {
    created_in_transaction = false;
  }
}

void utility_hook(PlannedStmt* statement, const char* query, bool read_only_tree,
                  ProcessUtilityContext context, ParamListInfo params,
                  QueryEnvironment* environment, DestReceiver* destination,
                  QueryCompletion* completion) {
  Node* tree = statement->utilityStmt;
  const bool ours = IsA(tree, CreateExtensionStmt) &&
                    strcmp(castNode(CreateExtensionStmt, tree)->extname, "idempotency") == 0;
  if (previous_utility != nullptr)
    previous_utility(statement, query, read_only_tree, context, params, environment, destination,
                     completion);
  else
    standard_ProcessUtility(statement, query, read_only_tree, context, params, environment,
                            destination, completion);
  if (!ours) return;
  if (!transaction_callback_registered) {
    RegisterXactCallback(at_transaction_end, nullptr);
    transaction_callback_registered = true;
  }
  created_in_transaction = true;
}

// Runs however the database worker exits (normally, FATAL, or an ERROR turned FATAL): the
// entry says it has exited, keeps its outcome for the launcher, and wakes the launcher.
void release_on_exit(int, Datum) {
  if (shared == nullptr || my_entry < 0) return;
  SpinLockAcquire(&shared->mutex);
  Entry& entry = shared->entries[my_entry];
  if (entry.pid == MyProcPid) {
    entry.pid = 0;
    entry.exited = true;
  }
  SpinLockRelease(&shared->mutex);
  my_entry = -1;
  wake_launcher();
}

void forget_launcher(int, Datum) {
  if (shared == nullptr) return;
  SpinLockAcquire(&shared->mutex);
  if (shared->launcher == MyProc) shared->launcher = nullptr;
  SpinLockRelease(&shared->mutex);
}

}  // namespace

void install() {
  shared_memory::reserve("idempotency cleanup", &shared, initialize);
  CacheRegisterSyscacheCallback(AUTHOID, role_changed, 0);
  previous_utility = ProcessUtility_hook;
  ProcessUtility_hook = utility_hook;
}

bool available() {
  return shared != nullptr;
}

uint64 role_generation() {
  return shared == nullptr ? 0 : pg_atomic_read_u64(&shared->role_generation);
}

uint64 extension_generation() {
  return shared == nullptr ? 0 : pg_atomic_read_u64(&shared->extension_generation);
}

void become_launcher() {
  if (shared == nullptr) return;
  SpinLockAcquire(&shared->mutex);
  shared->launcher = MyProc;
  SpinLockRelease(&shared->mutex);
  on_shmem_exit(forget_launcher, 0);
}

void wake_launcher() {
  if (shared == nullptr) return;
  SpinLockAcquire(&shared->mutex);
  PGPROC* launcher = shared->launcher;
  SpinLockRelease(&shared->mutex);
  // A PGPROC outlives its process: at worst the latch of whoever uses it now is set.
  if (launcher != nullptr) SetLatch(&launcher->procLatch);
}

int reserve(Oid database, uint64* ticket) {
  if (shared == nullptr) return -1;
  int found = -1;
  SpinLockAcquire(&shared->mutex);
  for (int i = 0; i < kMaxWorkers && found < 0; ++i) {
    if (shared->entries[i].database != InvalidOid) continue;
    found = i;
    *ticket = shared->next_ticket++;
    shared->entries[i] = Entry{};
    shared->entries[i].database = database;
    shared->entries[i].ticket = *ticket;
  }
  SpinLockRelease(&shared->mutex);
  // Read outside the spinlock (a system call); written once, read by the launcher only.
  if (found >= 0) {
    const TimestampTz now = GetCurrentTimestamp();
    SpinLockAcquire(&shared->mutex);
    shared->entries[found].reserved_at = now;
    SpinLockRelease(&shared->mutex);
  }
  return found;
}

void release(int index) {
  if (shared == nullptr || index < 0 || index >= kMaxWorkers) return;
  SpinLockAcquire(&shared->mutex);
  shared->entries[index] = Entry{};
  SpinLockRelease(&shared->mutex);
}

Entry entry(int index) {
  Entry copy;
  if (shared == nullptr || index < 0 || index >= kMaxWorkers) return copy;
  SpinLockAcquire(&shared->mutex);
  copy = shared->entries[index];
  SpinLockRelease(&shared->mutex);
  return copy;
}

bool serving(Oid database) {
  if (shared == nullptr) return false;
  bool found = false;
  SpinLockAcquire(&shared->mutex);
  for (const Entry& entry : shared->entries) found = found || entry.database == database;
  SpinLockRelease(&shared->mutex);
  return found;
}

bool take(int index, Oid database, uint64 ticket) {
  if (shared == nullptr || index < 0 || index >= kMaxWorkers) return false;
  bool taken = false;
  SpinLockAcquire(&shared->mutex);
  Entry& entry = shared->entries[index];
  if (entry.database == database && entry.ticket == ticket && entry.pid == 0 && !entry.exited) {
    entry.pid = MyProcPid;
    entry.outcome = Outcome::kRunning;
    taken = true;
  }
  SpinLockRelease(&shared->mutex);
  if (taken) {
    my_entry = index;
    on_shmem_exit(release_on_exit, 0);
  }
  return taken;
}

void set_outcome(Outcome outcome) {
  if (shared == nullptr || my_entry < 0) return;
  SpinLockAcquire(&shared->mutex);
  Entry& entry = shared->entries[my_entry];
  if (entry.pid == MyProcPid) entry.outcome = outcome;
  SpinLockRelease(&shared->mutex);
}

}  // namespace idem::cleanup_shared
