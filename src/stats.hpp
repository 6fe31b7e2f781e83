// Shared-memory statistics: per-database counters of claim outcomes and cleanup rounds.
// They exist only when the library is in shared_preload_libraries; without it, counting
// is a no-op and the idempotency_stats view says so.
#pragma once

#include "pg.hpp"

namespace idem::stats {

enum Counter : int {
  kClaimed,
  kReclaimed,
  kReplayed,
  kInProgress,
  kMismatched,
  kCompleted,
  kReleased,
  kExpiredDeleted,
  kCleanupRuns,
  kCounterCount
};

// Called from _PG_init while the postmaster loads the library (shared_preload_libraries).
void install_shared_memory_hooks();
// True when the shared counters exist in this server.
bool available();
// Adds n to a counter of the current database (lock-free).
void count(Counter counter, uint64 n = 1);
// Records the outcome of a cleanup round in database `database`.
void record_cleanup(Oid database, uint64 deleted, const char* error);
// Frees the slots of databases that no longer exist (`existing` lists every database), so
// that dropped databases neither show in the view nor use up slots. Called by the launcher.
void forget_dropped_databases(const Oid* existing, int count);

}  // namespace idem::stats
