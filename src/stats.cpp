// Shared-memory statistics. A fixed table of per-database slots: a backend finds (or takes)
// its database's slot once and then only does atomic increments, so counting costs no lock
// on the claim path.
#include "stats.hpp"

#include "pg_boundary.hpp"
#include "shared_memory.hpp"

namespace idem::stats {
namespace {

constexpr int kMaxDatabases = 256;
constexpr size_t kErrorLength = 256;

struct DatabaseSlot {
  Oid database;  // InvalidOid = free
  pg_atomic_uint64 counters[kCounterCount];
  TimestampTz last_cleanup;  // 0 = never; under the mutex
  uint64 last_cleanup_deleted;
  bool unfinished;          // the last round left expired keys behind (read once by the launcher)
  TimestampTz resume_from;  // where the round after an unfinished one starts
  char last_error[kErrorLength];
};

struct SharedStats {
  slock_t mutex;  // guards slot allocation and the non-atomic cleanup fields
  TimestampTz started;
  DatabaseSlot slots[kMaxDatabases];
};

SharedStats* shared = nullptr;
DatabaseSlot* my_slot = nullptr;  // this backend's database
void initialize(SharedStats* stats) {
  SpinLockInit(&stats->mutex);
  stats->started = GetCurrentTimestamp();
  for (DatabaseSlot& slot : stats->slots) {
    slot.database = InvalidOid;
    for (pg_atomic_uint64& counter : slot.counters) pg_atomic_init_u64(&counter, 0);
    slot.last_cleanup = 0;
    slot.last_cleanup_deleted = 0;
    slot.unfinished = false;
    slot.resume_from = DT_NOBEGIN;
    slot.last_error[0] = '\0';
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

void record_cleanup(Oid database, uint64 deleted, const char* error, bool unfinished,
                    TimestampTz resume_from) {
  if (shared == nullptr) return;
  DatabaseSlot* slot = slot_of(database);
  if (slot == nullptr) return;
  pg_atomic_fetch_add_u64(&slot->counters[kCleanupRuns], 1);
  TimestampTz now = GetCurrentTimestamp();
  SpinLockAcquire(&shared->mutex);
  slot->last_cleanup = now;
  slot->last_cleanup_deleted = deleted;
  slot->unfinished = unfinished;
  slot->resume_from = unfinished ? resume_from : DT_NOBEGIN;
  if (error != nullptr)
    strlcpy(slot->last_error, error, sizeof slot->last_error);
  else
    slot->last_error[0] = '\0';
  SpinLockRelease(&shared->mutex);
}

TimestampTz resume_point(Oid database) {
  if (shared == nullptr) return DT_NOBEGIN;
  DatabaseSlot* slot = slot_of(database);
  if (slot == nullptr) return DT_NOBEGIN;
  SpinLockAcquire(&shared->mutex);
  TimestampTz resume_from = slot->resume_from;
  SpinLockRelease(&shared->mutex);
  return resume_from;
}

bool take_unfinished(Oid database) {
  if (shared == nullptr) return false;
  bool unfinished = false;
  SpinLockAcquire(&shared->mutex);
  for (DatabaseSlot& slot : shared->slots) {
    if (slot.database != database) continue;
    unfinished = slot.unfinished;
    slot.unfinished = false;
    break;
  }
  SpinLockRelease(&shared->mutex);
  return unfinished;
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
    SpinLockAcquire(&shared->mutex);
    if (slot.database == database) {
      // A backend that cached this slot re-checks its database before counting.
      slot.database = InvalidOid;
      slot.last_cleanup = 0;
      slot.last_cleanup_deleted = 0;
      slot.unfinished = false;
      slot.resume_from = DT_NOBEGIN;
      slot.last_error[0] = '\0';
    }
    SpinLockRelease(&shared->mutex);
  }
}

namespace {

// idempotency_stats_rows(): one row per database with counters, for the view.
// Without shared memory: one row for the current database, counters NULL, and a note.
Datum sql_stats_rows(FunctionCallInfo fcinfo) {
  pg_call([&] { InitMaterializedSRF(fcinfo, 0); });
  auto* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);
  constexpr int kColumns = 2 + kCounterCount + 5;  // ..., last_error, note
  Datum values[kColumns];
  bool nulls[kColumns];

  if (shared == nullptr) {
    for (bool& null : nulls) null = true;
    values[0] = ObjectIdGetDatum(MyDatabaseId);
    nulls[0] = false;
    values[1] = BoolGetDatum(false);
    nulls[1] = false;
    pg_call([&] {
      values[kColumns - 1] = CStringGetTextDatum(
          "statistics need shared_preload_libraries = 'idempotency' (and a restart)");
      nulls[kColumns - 1] = false;
      tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
    });
    return static_cast<Datum>(0);
  }

  for (DatabaseSlot& slot : shared->slots) {
    SpinLockAcquire(&shared->mutex);
    Oid database = slot.database;
    TimestampTz last_cleanup = slot.last_cleanup;
    uint64 last_deleted = slot.last_cleanup_deleted;
    char last_error[kErrorLength];
    strlcpy(last_error, slot.last_error, sizeof last_error);
    SpinLockRelease(&shared->mutex);
    if (database == InvalidOid) continue;

    int column = 0;
    for (bool& null : nulls) null = false;
    values[column++] = ObjectIdGetDatum(database);
    values[column++] = BoolGetDatum(true);
    for (pg_atomic_uint64& counter : slot.counters)
      values[column++] = Int64GetDatum(static_cast<int64>(pg_atomic_read_u64(&counter)));
    values[column] = TimestampTzGetDatum(last_cleanup);
    nulls[column++] = last_cleanup == 0;
    values[column] = Int64GetDatum(static_cast<int64>(last_deleted));
    nulls[column++] = last_cleanup == 0;
    values[column] = TimestampTzGetDatum(shared->started);
    column++;
    nulls[column] = last_error[0] == '\0';
    nulls[kColumns - 1] = true;  // note: only used without shared memory
    pg_call([&] {
      if (!nulls[column]) values[column] = CStringGetTextDatum(last_error);
      tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
    });
  }
  return static_cast<Datum>(0);
}

}  // namespace
}  // namespace idem::stats

IDEM_SQL_FUNCTION(idempotency_stats_rows, idem::stats::sql_stats_rows)
