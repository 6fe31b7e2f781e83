// Shared-memory statistics. A fixed table of per-database slots: a backend finds (or takes)
// its database's slot once and then only does atomic increments, so counting costs no lock
// on the claim path.
#include "stats.hpp"

#include "cleanup_shared.hpp"
#include "pg_boundary.hpp"
#include "shared_memory.hpp"
#include "pg/srf.hpp"

namespace idem::stats {
namespace {

constexpr int kMaxDatabases = 256;
constexpr size_t kErrorLength = 256;

struct DatabaseSlot {
  Oid database;  // InvalidOid = free
  pg_atomic_uint64 counters[kCounterCount];
  pg_atomic_uint64 orphan_passes;
  pg_atomic_uint64 start_failures;
  // Under the mutex:
  TimestampTz last_cleanup;  // 0 = never
  uint64 last_cleanup_deleted;
  stats::Resume resume;  // where the round after an unfinished one starts
  char last_error[kErrorLength];
  TimestampTz last_orphan_pass;    // 0 = never
  TimestampTz last_start_failure;  // 0 = never
  uint64 orphans_done_generation;  // the role generation of the last complete pass
  Oid orphans_done_table;          // ... and the table it read
  stats::OrphanPass orphan_pass;   // the pass under way
  // A completion with a response_ttl shorter than the ttl happened here since the server
  // started: only then does the cleanup look for responses to drop (a read of the whole table,
  // which no index serves).
  bool responses_expire;
};

struct SharedStats {
  slock_t mutex;  // guards slot allocation and the non-atomic fields of the slots
  TimestampTz started;
  DatabaseSlot slots[kMaxDatabases];
};

SharedStats* shared = nullptr;
DatabaseSlot* my_slot = nullptr;  // this backend's database
// Empties a slot (the mutex is held, or nobody else can see the slot yet).
void clear_fields(DatabaseSlot& slot) {
  slot.last_cleanup = 0;
  slot.last_cleanup_deleted = 0;
  slot.resume = stats::Resume{};
  slot.last_error[0] = '\0';
  slot.last_orphan_pass = 0;
  slot.last_start_failure = 0;
  slot.orphans_done_generation = 0;
  slot.orphans_done_table = InvalidOid;
  slot.orphan_pass = stats::OrphanPass{};
  slot.responses_expire = false;
}

void initialize(SharedStats* stats) {
  SpinLockInit(&stats->mutex);
  stats->started = GetCurrentTimestamp();
  for (DatabaseSlot& slot : stats->slots) {
    slot.database = InvalidOid;
    for (pg_atomic_uint64& counter : slot.counters) pg_atomic_init_u64(&counter, 0);
    pg_atomic_init_u64(&slot.orphan_passes, 0);
    pg_atomic_init_u64(&slot.start_failures, 0);
    clear_fields(slot);
  }
}

// The slot of a database, taken on first use; nullptr when the table is full.
DatabaseSlot* slot_of(Oid database) {
  DatabaseSlot* free_slot = nullptr;
  DatabaseSlot* result = nullptr;
  SpinLockAcquire(&shared->mutex);
  for (DatabaseSlot& slot : shared->slots) {
    if (slot.database == database) {
      result = &slot;
      break;
    }
    if (slot.database == InvalidOid && free_slot == nullptr) free_slot = &slot;
  }
  if (result == nullptr && free_slot != nullptr) {
    free_slot->database = database;
    result = free_slot;
  }
  SpinLockRelease(&shared->mutex);
  return result;
}

}  // namespace

void install_shared_memory_hooks() {
  shared_memory::reserve("idempotency statistics", &shared, initialize);
}

bool available() {
  return shared != nullptr;
}

void count(Counter counter, uint64 n) {
  if (shared == nullptr || !OidIsValid(MyDatabaseId)) return;
  if (my_slot == nullptr || my_slot->database != MyDatabaseId) my_slot = slot_of(MyDatabaseId);
  if (my_slot != nullptr) pg_atomic_fetch_add_u64(&my_slot->counters[counter], n);
}

void record_cleanup(Oid database, uint64 deleted, const char* error, Resume resume) {
  if (shared == nullptr) return;
  DatabaseSlot* slot = slot_of(database);
  if (slot == nullptr) return;
  pg_atomic_fetch_add_u64(&slot->counters[kCleanupRuns], 1);
  TimestampTz now = GetCurrentTimestamp();
  SpinLockAcquire(&shared->mutex);
  slot->last_cleanup = now;
  slot->last_cleanup_deleted = deleted;
  slot->resume = resume;
  if (error != nullptr)
    strlcpy(slot->last_error, error, sizeof slot->last_error);
  else
    slot->last_error[0] = '\0';
  SpinLockRelease(&shared->mutex);
}

Resume resume_point(Oid database) {
  if (shared == nullptr) return {};
  DatabaseSlot* slot = slot_of(database);
  if (slot == nullptr) return {};
  SpinLockAcquire(&shared->mutex);
  const Resume resume = slot->resume;
  SpinLockRelease(&shared->mutex);
  return resume;
}

bool orphan_pass_due(Oid database, Oid table, uint64 generation, bool pending_counts) {
  // Without a launcher, nobody follows the resets of the invalidation queue (see
  // cleanup_shared.hpp): every run makes the pass.
  if (shared == nullptr || !cleanup_shared::launcher_running()) return true;
  DatabaseSlot* slot = slot_of(database);
  if (slot == nullptr) return true;  // no slot to remember a pass in: always
  SpinLockAcquire(&shared->mutex);
  bool due = slot->orphans_done_generation != generation || slot->orphans_done_table != table ||
             slot->orphan_pass.again || (pending_counts && cleanup_shared::role_change_pending());
  SpinLockRelease(&shared->mutex);
  return due;
}

OrphanPass orphan_pass_progress(Oid database) {
  OrphanPass pass;
  if (shared == nullptr) return pass;
  DatabaseSlot* slot = slot_of(database);
  if (slot == nullptr) return pass;
  SpinLockAcquire(&shared->mutex);
  pass = slot->orphan_pass;
  SpinLockRelease(&shared->mutex);
  return pass;
}

void save_orphan_pass_progress(Oid database, const OrphanPass& pass) {
  if (shared == nullptr) return;
  DatabaseSlot* slot = slot_of(database);
  if (slot == nullptr) return;
  SpinLockAcquire(&shared->mutex);
  slot->orphan_pass = pass;
  SpinLockRelease(&shared->mutex);
}

void finish_orphan_pass(Oid database, Oid table, uint64 generation) {
  if (shared == nullptr) return;
  DatabaseSlot* slot = slot_of(database);
  if (slot == nullptr) return;
  pg_atomic_fetch_add_u64(&slot->orphan_passes, 1);
  TimestampTz now = GetCurrentTimestamp();
  SpinLockAcquire(&shared->mutex);
  slot->orphans_done_generation = generation;
  slot->orphans_done_table = table;
  // A pass under way for an older generation is overtaken by this complete one.
  if (slot->orphan_pass.generation <= generation) slot->orphan_pass = OrphanPass{};
  slot->last_orphan_pass = now;
  SpinLockRelease(&shared->mutex);
}

void note_response_expiry(Oid database) {
  if (shared == nullptr) return;
  DatabaseSlot* slot = slot_of(database);
  if (slot == nullptr) return;
  SpinLockAcquire(&shared->mutex);
  slot->responses_expire = true;
  SpinLockRelease(&shared->mutex);
}

bool responses_may_expire(Oid database) {
  if (shared == nullptr) return true;
  DatabaseSlot* slot = slot_of(database);
  if (slot == nullptr) return true;
  SpinLockAcquire(&shared->mutex);
  const bool expire = slot->responses_expire;
  SpinLockRelease(&shared->mutex);
  return expire;
}

void count_start_failure(Oid database) {
  if (shared == nullptr) return;
  DatabaseSlot* slot = slot_of(database);
  if (slot == nullptr) return;
  pg_atomic_fetch_add_u64(&slot->start_failures, 1);
  TimestampTz now = GetCurrentTimestamp();
  SpinLockAcquire(&shared->mutex);
  slot->last_start_failure = now;
  SpinLockRelease(&shared->mutex);
}

void forget_dropped_databases(const Oid* existing, int count) {
  if (shared == nullptr) return;
  for (DatabaseSlot& slot : shared->slots) {
    // Decide outside the spinlock (it must be held for a few instructions only), then
    // free the slot only if it still belongs to the same database.
    SpinLockAcquire(&shared->mutex);
    Oid database = slot.database;
    SpinLockRelease(&shared->mutex);
    if (database == InvalidOid) continue;
    bool exists = false;
    for (int i = 0; i < count && !exists; ++i) exists = existing[i] == database;
    if (exists) continue;
    for (pg_atomic_uint64& counter : slot.counters) pg_atomic_write_u64(&counter, 0);
    pg_atomic_write_u64(&slot.orphan_passes, 0);
    pg_atomic_write_u64(&slot.start_failures, 0);
    SpinLockAcquire(&shared->mutex);
    if (slot.database == database) {
      // A backend that cached this slot re-checks its database before counting.
      slot.database = InvalidOid;
      clear_fields(slot);
    }
    SpinLockRelease(&shared->mutex);
  }
}

namespace {

// The columns of idempotency_stats_rows(), in order. 1.0 and 1.1 declare the first 16 (up to
// note), 1.2 four more, 1.3 the rest too: a server whose library is newer than its installation
// (between the library's installation and ALTER EXTENSION UPDATE) still answers the old view.
enum Column : int {
  kDatabase,
  kSharedMemory,
  kFirstCounter,  // claimed ... cleanup_runs, in Counter order
  kLastCleanup = kFirstCounter + kCountersOf10,
  kLastCleanupDeleted,
  kStatsSince,
  kLastError,
  kNote,
  kColumnsOf11,  // what 1.0 and 1.1 declare
  kOrphanPasses = kColumnsOf11,
  kLastOrphanPass,
  kWorkerStartFailures,
  kLastStartFailure,
  kColumnsOf12,  // what 1.2 declares
  kForgottenKeys = kColumnsOf12,
  kColumnCount
};

// Refuses a declaration of idempotency_stats_rows() with `declared` columns that this library
// does not know (it would fill columns that are not there, or leave some unset).
void check_declared_columns(int declared) {
  if (declared != kColumnsOf11 && declared != kColumnsOf12 && declared != kColumnCount)
    throw Error(ERRCODE_DATATYPE_MISMATCH,
                "idempotency_stats_rows() is declared with " + std::to_string(declared) +
                    " columns, the library knows " + std::to_string(kColumnsOf11) + ", " +
                    std::to_string(kColumnsOf12) + " or " + std::to_string(kColumnCount),
                {}, "ALTER EXTENSION idempotency UPDATE installs the declaration of this library.");
}

// Without shared memory, the one row: the current database, counters NULL, and a note.
void put_note_row(ReturnSetInfo* rsinfo) {
  // The tuple takes the declared number of columns from the front of these arrays.
  Datum values[kColumnCount];
  bool nulls[kColumnCount];
  for (bool& null : nulls) null = true;
  values[kDatabase] = ObjectIdGetDatum(MyDatabaseId);
  nulls[kDatabase] = false;
  values[kSharedMemory] = BoolGetDatum(false);
  nulls[kSharedMemory] = false;
  values[kNote] = pg::srf::text_value(
      "statistics need shared_preload_libraries = 'idempotency' (and a restart)");
  nulls[kNote] = false;
  pg::srf::put_row(rsinfo, values, nulls);
}

// The row of `slot`, none for a free slot: its plain fields copied under the mutex, its
// counters read atomically.
void put_slot_row(DatabaseSlot& slot, ReturnSetInfo* rsinfo) {
  SpinLockAcquire(&shared->mutex);
  Oid database = slot.database;
  TimestampTz last_cleanup = slot.last_cleanup;
  uint64 last_deleted = slot.last_cleanup_deleted;
  TimestampTz last_orphan_pass = slot.last_orphan_pass;
  TimestampTz last_start_failure = slot.last_start_failure;
  char last_error[kErrorLength];
  strlcpy(last_error, slot.last_error, sizeof last_error);
  SpinLockRelease(&shared->mutex);
  if (database == InvalidOid) return;

  // The tuple takes the declared number of columns from the front of these arrays.
  Datum values[kColumnCount];
  bool nulls[kColumnCount];
  for (bool& null : nulls) null = false;
  values[kDatabase] = ObjectIdGetDatum(database);
  values[kSharedMemory] = BoolGetDatum(true);
  for (int i = 0; i < kCountersOf10; ++i)
    values[kFirstCounter + i] =
        Int64GetDatum(static_cast<int64>(pg_atomic_read_u64(&slot.counters[i])));
  values[kLastCleanup] = TimestampTzGetDatum(last_cleanup);
  nulls[kLastCleanup] = last_cleanup == 0;
  values[kLastCleanupDeleted] = Int64GetDatum(static_cast<int64>(last_deleted));
  nulls[kLastCleanupDeleted] = last_cleanup == 0;
  values[kStatsSince] = TimestampTzGetDatum(shared->started);
  nulls[kLastError] = last_error[0] == '\0';
  nulls[kNote] = true;  // only used without shared memory
  values[kOrphanPasses] =
      Int64GetDatum(static_cast<int64>(pg_atomic_read_u64(&slot.orphan_passes)));
  values[kLastOrphanPass] = TimestampTzGetDatum(last_orphan_pass);
  nulls[kLastOrphanPass] = last_orphan_pass == 0;
  values[kWorkerStartFailures] =
      Int64GetDatum(static_cast<int64>(pg_atomic_read_u64(&slot.start_failures)));
  values[kLastStartFailure] = TimestampTzGetDatum(last_start_failure);
  nulls[kLastStartFailure] = last_start_failure == 0;
  values[kForgottenKeys] =
      Int64GetDatum(static_cast<int64>(pg_atomic_read_u64(&slot.counters[kForgotten])));
  if (!nulls[kLastError]) values[kLastError] = pg::srf::text_value(last_error);
  pg::srf::put_row(rsinfo, values, nulls);
}

// idempotency_stats_rows(): one row per database with counters, for the view.
// Without shared memory: one row for the current database, counters NULL, and a note.
Datum sql_stats_rows(FunctionCallInfo fcinfo) {
  pg::srf::materialize(fcinfo);
  auto* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);
  check_declared_columns(rsinfo->setDesc->natts);
  if (shared == nullptr) {
    put_note_row(rsinfo);
    return static_cast<Datum>(0);
  }
  for (DatabaseSlot& slot : shared->slots) put_slot_row(slot, rsinfo);
  return static_cast<Datum>(0);
}

}  // namespace
}  // namespace idem::stats

IDEM_SQL_FUNCTION(idempotency_stats_rows, idem::stats::sql_stats_rows)
