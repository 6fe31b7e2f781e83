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
  // 1.3: keys deleted by forget_key (its own column after the 1.2 columns of the view).
  kForgotten,
  kCounterCount
};
// The counters that idempotency_stats_rows() has shown since 1.0, in its column order.
constexpr int kCountersOf10 = kCleanupRuns + 1;

// Called from _PG_init while the postmaster loads the library (shared_preload_libraries).
void install_shared_memory_hooks();
// True when the shared counters exist in this server.
bool available();
// Adds n to a counter of the current database (lock-free).
void count(Counter counter, uint64 n = 1);
// Records the end of a cleanup round in database `database`: one more run, its time, how
// many keys it deleted and its error (nullptr: none). The deleted keys themselves are
// counted batch by batch with count(kExpiredDeleted, n), so the view shows progress.
// `resume` is where the next round starts when this one stopped early with expired keys left
// (its largest expires_at under a B-Tree, its block under a BRIN); the start otherwise.
struct Resume {
  TimestampTz expiry = DT_NOBEGIN;
  BlockNumber block = 0;
};
void record_cleanup(Oid database, uint64 deleted, const char* error, Resume resume = {});
// Where a round in `database` should start: after an unfinished round, where it stopped
// (the keys before it are gone, or locked, and then the next full round retries them);
// otherwise the start (of the expires_at index, or block 0).
Resume resume_point(Oid database);

// The pass over keys whose owner names no role (cleanup.cpp). It runs when the role
// generation (cleanup_shared.hpp) moved since the last complete pass over this database's
// table, and may take several rounds: where it stands is kept here between them.
struct OrphanPass {
  uint64 generation = 0;        // the role generation the pass started at; 0: no pass under way
  Oid table = InvalidOid;       // the key table it walks
  Oid relation = InvalidOid;    // the relation (the table or a Citus shard) it has reached
  BlockNumber block = 0;        // the next block to read in it
  bool skipped_locked = false;  // a key of no role was skipped (locked): not complete
  // The last read to the end skipped locked keys of no role: due again whatever the role
  // generation (the change that made them may never move it: a role made and dropped in one
  // transaction, keys restored for a name that names no role).
  bool again = false;
  // A role was dropped or renamed while the pass was under way: it goes on from where it was
  // (never back to block 0, so that no churn of roles can keep it from ending), reads to the
  // end, and comes round again to (stop_relation, stop_block), where it stood at the change.
  bool wraps = false;
  bool wrapped = false;  // it has come round to the start
  Oid stop_relation = InvalidOid;
  BlockNumber stop_block = 0;
};
// True when `database` needs a pass over `table` at role generation `generation`, or the last
// read skipped locked keys of no role, or (`pending_counts`: an idempotency_cleanup() call)
// when a pg_authid change waits for the launcher's look; always true without shared memory or
// without a launcher.
bool orphan_pass_due(Oid database, Oid table, uint64 generation, bool pending_counts);
// A completion in `database` kept its response shorter than its key (response_ttl): from now
// on the cleanup looks for responses to drop there. Without shared memory it always looks.
void note_response_expiry(Oid database);
bool responses_may_expire(Oid database);
// The pass under way in `database` (generation 0: none).
OrphanPass orphan_pass_progress(Oid database);
void save_orphan_pass_progress(Oid database, const OrphanPass& pass);
// The pass that started at `generation` has read all of `table`: one more in orphan_passes.
void finish_orphan_pass(Oid database, Oid table, uint64 generation);

// The launcher or idempotency_cleanup() could not start a background worker for `database`
// (every max_worker_processes slot taken).
void count_start_failure(Oid database);
// Frees the slots of databases that no longer exist (`existing` lists every database), so
// that dropped databases neither show in the view nor use up slots. Called by the launcher.
void forget_dropped_databases(const Oid* existing, int count);

}  // namespace idem::stats
