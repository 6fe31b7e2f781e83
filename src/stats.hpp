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
// Records the end of a cleanup round in database `database`: one more run, its time, how
// many keys it deleted and its error (nullptr: none). The deleted keys themselves are
// counted batch by batch with count(kExpiredDeleted, n), so the view shows progress.
// `unfinished` says the round stopped early with expired keys left (worker only).
// `resume_from` is where the next round of an unfinished one starts (its largest expires_at).
void record_cleanup(Oid database, uint64 deleted, const char* error, bool unfinished = false,
                    TimestampTz resume_from = DT_NOBEGIN);
// Where a round in `database` should start: after an unfinished round, where it stopped
// (the keys before it are gone, or locked, and then the next full round retries them);
// otherwise DT_NOBEGIN (the start of the expires_at index).
TimestampTz resume_point(Oid database);
// True (once) when the last round in `database` ended unfinished: the launcher then starts
// the next round at once instead of after the interval.
bool take_unfinished(Oid database);
// Frees the slots of databases that no longer exist (`existing` lists every database), so
// that dropped databases neither show in the view nor use up slots. Called by the launcher.
void forget_dropped_databases(const Oid* existing, int count);

}  // namespace idem::stats
