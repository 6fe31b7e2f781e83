// Shared state of the cleanup launcher, its workers and the sessions (cleanup_shared.hpp).
// Everything here is plain C-style code: it runs in hooks and callbacks of every backend and
// in exit callbacks, where no C++ object with a destructor may live.
#include "cleanup_shared.hpp"

#include "shared_memory.hpp"
#include "siphash.hpp"

namespace idem::cleanup_shared {
namespace {

struct Shared {
  pg_atomic_uint64 role_generation;
  pg_atomic_uint64 authid_changes;  // pg_authid changes that processes learned of
  pg_atomic_uint64 authid_checked;  // the changes the launcher's last look covered
  pg_atomic_uint64 extension_generation;
  slock_t mutex;  // guards what follows
  PGPROC* launcher;
  uint64 next_ticket;
  Entry entries[kMaxWorkers];
};

Shared* shared = nullptr;
int my_entry = -1;  // the registry entry of this database worker
bool is_launcher = false;
bool roles_reset = true;  // launcher: pg_authid must be read (at start, after a reset)

void initialize(Shared* state) {
  // Generations start at 1: a database whose pass has never run remembers 0.
  pg_atomic_init_u64(&state->role_generation, 1);
  pg_atomic_init_u64(&state->authid_changes, 0);
  pg_atomic_init_u64(&state->authid_checked, 0);
  pg_atomic_init_u64(&state->extension_generation, 1);
  SpinLockInit(&state->mutex);
  state->launcher = nullptr;
  state->next_ticket = 1;
  for (Entry& entry : state->entries) entry = Entry{};
}

// A pg_authid row changed (a role created, altered, renamed or dropped, a password set): most
// changes cannot orphan a key, and a role with LOGIN alone can make them at will (ALTER ROLE
// CURRENT_USER PASSWORD), so no change bumps the role generation by itself. Each process
// that learns of a change counts it (authid_changes); the launcher, which reads the
// invalidation queue every round, then looks at pg_authid (check_roles()) and bumps the
// generation only if a role vanished: dropped, or renamed. A cache reset (hash value 0) names
// no row: the launcher looks then too. The process that made the change learns first, before
// its commit, and counts it again at the commit; the launcher learns after it, so a look that
// ran before the commit is made again.
bool authid_changed_here = false;  // this transaction changed pg_authid (counted at commit)
// This transaction ran DROP ROLE or a role's RENAME (utility_hook): at its commit the process
// moves the role generation itself. The launcher's fingerprint misses a role created and
// dropped between two of its looks, and the statistics that tell it of such a drop arrive a
// second or so later: without this, a cleanup right after the commit would not see the drop.
bool role_vanished_here = false;

// The process that made the change counts it once more at its commit: a look of the launcher
// between the change and the commit saw the role still there, and covered the first count.
void count_at_commit(XactEvent event, void*) {
  if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_PARALLEL_COMMIT) {
    if (authid_changed_here && shared != nullptr)
      pg_atomic_fetch_add_u64(&shared->authid_changes, 1);
    if (role_vanished_here && shared != nullptr)
      pg_atomic_fetch_add_u64(&shared->role_generation, 1);
    authid_changed_here = false;
    role_vanished_here = false;
  } else if (event == XACT_EVENT_ABORT || event == XACT_EVENT_PARALLEL_ABORT) {
    authid_changed_here = false;
    role_vanished_here = false;
  }
}

void role_changed(Datum, SyscacheId, uint32 hash_value) {
  if (shared == nullptr) return;
  if (is_launcher) {
    roles_reset = true;
  } else if (hash_value != 0) {
    pg_atomic_fetch_add_u64(&shared->authid_changes, 1);
    authid_changed_here = authid_changed_here || IsTransactionState();
  }
}

// The launcher's fingerprint of pg_authid: a keyed 64-bit hash (SipHash) of every (oid,
// name), sorted. The key is random per launcher and never leaves it, so that no role can pick
// a name whose hash would hide another role's disappearance.
struct RoleSet {
  MemoryContext context = nullptr;
  bool keyed = false;  // false if no random key could be had: every reset then counts
  uint64 key[2] = {0, 0};
  uint64* hashes = nullptr;
  int count = 0;
};
RoleSet known_roles;

// Rows ever deleted from pg_authid, as the cumulative statistics last showed them to the
// launcher (-1: not read yet). Every DROP ROLE deletes one, also of a role created and dropped
// between two looks at pg_authid, which the fingerprint above never saw: such a role may have
// left keys too. The statistics arrive within a second or so of the drop's commit, so a round
// that reads them too early sees the drop in a later round.
PgStat_Counter known_role_deletions = -1;

// pg-frame: called by check_roles only (owns no C++ object).
bool roles_were_deleted() {
  const PgStat_StatTabEntry* entry = pgstat_fetch_stat_tabentry_ext(true, AuthIdRelationId);
  const PgStat_Counter deletions = entry == nullptr ? 0 : entry->tuples_deleted;
  const bool deleted = known_role_deletions >= 0 && deletions > known_role_deletions;
  known_role_deletions = deletions;
  return deleted;
}

int compare_hashes(const void* a, const void* b) {
  const uint64 x = *static_cast<const uint64*>(a);
  const uint64 y = *static_cast<const uint64*>(b);
  return x < y ? -1 : (x > y ? 1 : 0);
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

// The ProcessUtility hook, in every backend: notes CREATE EXTENSION idempotency (for the
// launcher, at commit) and DROP ROLE or a role's RENAME (for the role generation).
// pg-frame: called by PostgreSQL around every utility statement; it owns no C++ object.
void utility_hook(PlannedStmt* statement, const char* query, bool read_only_tree,
                  ProcessUtilityContext context, ParamListInfo params,
                  QueryEnvironment* environment, DestReceiver* destination,
                  QueryCompletion* completion) {
  Node* tree = statement->utilityStmt;
  const bool ours = IsA(tree, CreateExtensionStmt) &&
                    strcmp(castNode(CreateExtensionStmt, tree)->extname, "idempotency") == 0;
  const bool role_vanishes =
      IsA(tree, DropRoleStmt) ||
      (IsA(tree, RenameStmt) && castNode(RenameStmt, tree)->renameType == OBJECT_ROLE);
  if (previous_utility != nullptr)
    previous_utility(statement, query, read_only_tree, context, params, environment, destination,
                     completion);
  else
    standard_ProcessUtility(statement, query, read_only_tree, context, params, environment,
                            destination, completion);
  if (role_vanishes) role_vanished_here = true;
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
  RegisterXactCallback(count_at_commit, nullptr);  // inherited by every backend
  previous_utility = ProcessUtility_hook;
  ProcessUtility_hook = utility_hook;
}

bool available() {
  return shared != nullptr;
}

uint64 role_generation() {
  return shared == nullptr ? 0 : pg_atomic_read_u64(&shared->role_generation);
}

bool role_change_pending() {
  return shared != nullptr &&
         pg_atomic_read_u64(&shared->authid_changes) != pg_atomic_read_u64(&shared->authid_checked);
}

uint64 extension_generation() {
  return shared == nullptr ? 0 : pg_atomic_read_u64(&shared->extension_generation);
}

void become_launcher() {
  if (shared == nullptr) return;
  is_launcher = true;
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

bool launcher_running() {
  if (shared == nullptr) return false;
  SpinLockAcquire(&shared->mutex);
  const bool running = shared->launcher != nullptr;
  SpinLockRelease(&shared->mutex);
  return running;
}

// pg-frame: called by the launcher's plan_round only, itself a pg-frame (owns no C++ object).
void check_roles() {
  if (shared == nullptr) return;
  // Every round: the statistics of a drop may arrive after the invalidation that woke us.
  if (roles_were_deleted()) pg_atomic_fetch_add_u64(&shared->role_generation, 1);
  if (!roles_reset) return;
  roles_reset = false;
  // Read before pg_authid: a change counted later is looked at again.
  const uint64 changes = pg_atomic_read_u64(&shared->authid_changes);
  if (known_roles.context == nullptr) {
    known_roles.context =
        AllocSetContextCreate(TopMemoryContext, "idempotency roles", ALLOCSET_SMALL_SIZES);
    known_roles.keyed = pg_strong_random(known_roles.key, sizeof known_roles.key);
  }
  if (!known_roles.keyed) {
    pg_atomic_fetch_add_u64(&shared->role_generation, 1);
    pg_atomic_write_u64(&shared->authid_checked, changes);
    return;
  }
  MemoryContext old = MemoryContextSwitchTo(known_roles.context);
  int capacity = 64;
  int count = 0;
  uint64* hashes = static_cast<uint64*>(palloc(capacity * sizeof(uint64)));
  Relation catalog = table_open(AuthIdRelationId, AccessShareLock);
  SysScanDesc scan = systable_beginscan(catalog, InvalidOid, false, nullptr, 0, nullptr);
  HeapTuple tuple;
  while ((tuple = systable_getnext(scan)) != nullptr) {
    auto* role = reinterpret_cast<Form_pg_authid>(GETSTRUCT(tuple));
    struct {
      Oid oid;
      NameData name;
    } identity;
    memset(&identity, 0, sizeof identity);
    identity.oid = role->oid;
    namestrcpy(&identity.name, NameStr(role->rolname));
    if (count == capacity) {
      capacity *= 2;
      hashes = static_cast<uint64*>(repalloc(hashes, capacity * sizeof(uint64)));
    }
    SipHash24 hash(known_roles.key[0], known_roles.key[1]);
    hash.update(reinterpret_cast<const unsigned char*>(&identity), sizeof identity);
    hashes[count++] = hash.finish();
  }
  systable_endscan(scan);
  table_close(catalog, AccessShareLock);
  MemoryContextSwitchTo(old);
  qsort(hashes, count, sizeof(uint64), compare_hashes);
  // A role of the last reading that is not in this one: dropped, or renamed.
  bool vanished = false;
  for (int i = 0, j = 0; i < known_roles.count && !vanished; ++i) {
    while (j < count && hashes[j] < known_roles.hashes[i]) ++j;
    vanished = j == count || hashes[j] != known_roles.hashes[i];
  }
  if (vanished) pg_atomic_fetch_add_u64(&shared->role_generation, 1);
  pg_atomic_write_u64(&shared->authid_checked, changes);
  if (known_roles.hashes != nullptr) pfree(known_roles.hashes);
  known_roles.hashes = hashes;
  known_roles.count = count;
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
