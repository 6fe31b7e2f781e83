// The deletions of the cleanup (cleanup.hpp): the batch transactions, the pass over keys of
// dropped roles and the batches of expired keys. The statements are in cleanup_statements.cpp,
// the pauses between batches in cleanup_throttle.cpp.
#include "cleanup.hpp"

#include <algorithm>

#include "caller.hpp"
#include "cleanup_shared.hpp"
#include "cleanup_statements.hpp"
#include "cleanup_throttle.hpp"
#include "gucs.hpp"
#include "pg/catalog.hpp"
#include "pg/gucs.hpp"
#include "pg/installation.hpp"
#include "pg/snapshots.hpp"
#include "pg/spi.hpp"
#include "pg/transactions.hpp"
#include "pg_boundary.hpp"
#include "stats.hpp"
#include "worker_session.hpp"

namespace idem::cleanup {
namespace {

// About as many rows as fit a heap page of the key table (rows of 150 to 250 bytes, fillfactor
// 90): an orphan batch reads batch_size / kRowsPerPage pages, about batch_size rows.
constexpr int kRowsPerPage = 32;

// Is the background cleanup off here: idempotency.cleanup_worker = off in postgresql.conf,
// or for this database (ALTER DATABASE ... SET, which only a superuser may make for a
// superuser-only parameter)? The database's setting is read from pg_db_role_setting with a
// catalog snapshot taken now: a setting committed before it is seen.
bool paused_here() {
  if (!gucs::cleanup_worker) return true;
  return pg::gucs::off_for_database("idempotency.cleanup_worker");
}

enum class Step { kDone, kNotInstalled, kPaused };

// Runs `body(installation)` in a transaction of its own (worker_spi's pattern: a fresh
// snapshot, an SPI connection, the batch deadline, all released before returning) as the
// installation's owner, and commits it. The installation is looked up and checked in every
// transaction (caller.hpp). When the request obeys the pause, a batch made while the pause
// was set is rolled back instead of committed.
[[noreturn]] void reject_other_installation() {
  throw Error(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
              "idempotency_cleanup() sees another installation of the extension than its caller",
              "The deletions run in a transaction of their own, which sees only what is "
              "committed: the calling transaction dropped or created the extension.",
              "Call idempotency_cleanup() after that transaction has committed.");
}

template <typename Body>
Step in_transaction(const Request& request, Progress& progress, const char* activity, Body&& body) {
  pg::transactions::start();
  worker_session::arm_batch_deadline();
  pg::snapshots::push_transaction();
  pgstat_report_activity(STATE_RUNNING, activity);
  // The calling transaction may have dropped and created the extension: the committed
  // installation's table, found by name without a lock (a full check would wait on the
  // calling transaction's lock of the dropped table), tells.
  if (OidIsValid(request.table)) {
    const Oid schema = pg::installation::extension_schema();
    const Oid committed =
        OidIsValid(schema) ? pg::catalog::relation_id("idempotency_keys", schema) : InvalidOid;
    if (OidIsValid(committed) && committed != request.table) reject_other_installation();
  }
  std::optional<caller::Installation> installation = caller::of_database();
  Step step = Step::kDone;
  if (!installation)
    step = Step::kNotInstalled;
  else if (request.obey_pause && paused_here())
    step = Step::kPaused;
  if (installation && OidIsValid(request.table) && installation->table != request.table)
    reject_other_installation();
  if (step == Step::kDone) {
    caller::ActingAsOwner acting(*installation);
    if (!pg::spi::connect()) throw Error(ERRCODE_INTERNAL_ERROR, "SPI_connect failed");
    body(*installation);
    // Measured before SPI_finish frees the batch's memory: what a batch needs at most.
    progress.peak_memory =
        std::max(progress.peak_memory, MemoryContextMemAllocated(TopMemoryContext, true));
    pg::spi::finish();
    // Paused while the batch ran: its snapshot may see rows committed after the pause.
    if (request.obey_pause && paused_here()) step = Step::kPaused;
  }
  pg::snapshots::pop_active();
  if (step == Step::kPaused)
    pg::transactions::abort();
  else
    pg::transactions::commit();
  worker_session::disarm_batch_deadline();
  pgstat_report_activity(STATE_IDLE, nullptr);
  return step;
}

// After a batch that may have left more to do: the throttle's pause, and a chance to stop.
void pause(Throttle& throttle, uint64 deleted, Progress& progress) {
  throttle.pause_after_batch(deleted);
  progress.pauses = throttle.pauses();
  progress.paused_ms = throttle.paused_ms();
  check_for_interrupts();
}

// Should the run stop here (keys may be left)? Its time is up, the process is asked to stop,
// or the backend that waits for it is gone.
bool should_stop(const Request& request, TimestampTz started) {
  if (worker_session::stop_requested()) return true;
  if (request.time_budget_us > 0 && GetCurrentTimestamp() - started >= request.time_budget_us)
    return true;
  if (request.requester != 0) return !pg::transactions::backend_exists(request.requester);
  return false;
}

// Has a pass that wraps come round to where it stood when the last role change arrived?
bool came_round(const stats::OrphanPass& pass) {
  return pass.wrapped && (pass.relation > pass.stop_relation ||
                          (pass.relation == pass.stop_relation && pass.block >= pass.stop_block));
}

// One batch of the pass over keys of dropped or renamed roles: the next range of blocks from
// where `pass` stands, in the relation it has reached or the next one (a shard may have moved
// away). Moves `pass` on and adds to `deleted`; true when the pass is complete.
bool orphan_batch(Oid table, int batch_size, stats::OrphanPass& pass, uint64& deleted) {
  const BlockNumber blocks_per_batch =
      static_cast<BlockNumber>(std::max(1, batch_size / kRowsPerPage));
  const std::vector<Oid> relations = statements::key_relations(table);
  for (;;) {
    if (came_round(pass)) return true;
    auto at = std::lower_bound(relations.begin(), relations.end(), pass.relation);
    if (at != relations.end() && *at != pass.relation) pass.block = 0;
    for (; at != relations.end(); ++at, pass.block = 0) {
      const BlockNumber blocks = statements::relation_blocks(*at);
      pass.relation = *at;
      if (came_round(pass)) return true;
      if (pass.block >= blocks) continue;
      const BlockNumber end = pass.block + std::min(blocks_per_batch, blocks - pass.block);
      const statements::Orphans orphans =
          statements::delete_orphans_in(*at, pass.block, end, batch_size);
      deleted = orphans.deleted;
      pass.skipped_locked = pass.skipped_locked || orphans.skipped;
      // A full batch may have left more in the same blocks: they are read again.
      if (deleted < static_cast<uint64>(batch_size)) pass.block = end;
      return false;
    }
    // The end of the last relation: done, unless a change arrived on the way and the blocks
    // before where the pass stood then are still to be read.
    if (!pass.wraps || pass.wrapped) return true;
    pass.wrapped = true;
    pass.relation = InvalidOid;
    pass.block = 0;
  }
}

// The pass over keys of dropped or renamed roles, when one is due (a role was dropped or
// renamed since the last complete pass); false when the run must stop (paused, out of time).
bool delete_orphans(const Request& request, Oid table, TimestampTz started, Throttle& throttle,
                    Progress& progress) {
  const Oid database = MyDatabaseId;
  const uint64 generation = cleanup_shared::role_generation();
  if (!stats::orphan_pass_due(database, table, generation, request.requester != 0)) return true;
  stats::OrphanPass pass = stats::orphan_pass_progress(database);
  if (!request.resume || pass.generation == 0 || pass.table != table) {
    const bool again = pass.again;  // kept until a read to the end skips nothing
    pass = {generation, table, InvalidOid, 0, false};
    pass.again = again;
  } else if (pass.generation != generation) {
    // Another change since the pass started: it goes on from here, and round to here again.
    pass.generation = generation;
    pass.wraps = pass.relation != InvalidOid || pass.block != 0;
    pass.wrapped = false;
    pass.stop_relation = pass.relation;
    pass.stop_block = pass.block;
  }
  for (;;) {
    const int rows = throttle.start_batch(request.batch_size);
    bool complete = false;
    uint64 deleted = 0;
    progress.orphan_pass = true;
    const Step step = in_transaction(
        request, progress, "idempotency cleanup: deleting keys of dropped roles",
        [&](const caller::Installation&) { complete = orphan_batch(table, rows, pass, deleted); });
    if (step == Step::kPaused) {
      progress.paused = true;
      return false;
    }
    if (step == Step::kNotInstalled) return false;  // dropped since the run started
    progress.deleted += deleted;
    stats::count(stats::kExpiredDeleted, deleted);
    if (complete && pass.skipped_locked) {
      // Keys of no role were locked by another transaction and skipped: the pass is due
      // again, from the start, in the next round or call, whatever the role generation does
      // (a pass marked done would leave them until the next role change, and the change that
      // made them may never move the generation).
      stats::OrphanPass again{generation, table, InvalidOid, 0, false};
      again.again = true;
      stats::save_orphan_pass_progress(database, again);
      return true;
    }
    if (complete) {
      stats::finish_orphan_pass(database, table, generation);
      return true;
    }
    stats::save_orphan_pass_progress(database, pass);
    pause(throttle, deleted, progress);
    if (should_stop(request, started)) {
      progress.unfinished = true;
      return false;
    }
  }
}

// The batches of expired keys, until none is left or the run must stop.
void delete_expired_keys(const Request& request, TimestampTz started, Throttle& throttle,
                         Progress& progress) {
  statements::Cursor cursor;
  // After an unfinished round, go on where it stopped instead of walking again over the
  // index entries (B-Tree) or the blocks (BRIN) of the keys it deleted (dead until VACUUM).
  if (request.resume) {
    const stats::Resume resume = stats::resume_point(MyDatabaseId);
    cursor.expiry = resume.expiry;
    cursor.start = cursor.block = resume.block;
  }
  for (;;) {
    const int rows = throttle.start_batch(request.batch_size);
    statements::Cursor moved = cursor;
    statements::Batch done;
    const Step step = in_transaction(
        request, progress, "idempotency cleanup: deleting a batch of expired keys",
        [&](const caller::Installation& installation) {
          done = statements::delete_expired(installation.table, request.now, moved, rows);
        });
    if (step == Step::kPaused) progress.paused = true;
    if (step != Step::kDone) return;
    cursor = moved;
    progress.deleted += done.deleted;
    // Counted batch by batch, so that the view shows a long run's progress.
    stats::count(stats::kExpiredDeleted, done.deleted);
    if (!done.full) return;  // fewer keys than asked for: none is left
    pause(throttle, done.deleted, progress);
    if (should_stop(request, started)) {
      progress.unfinished = true;
      progress.resume_from = cursor.expiry;
      progress.resume_block = cursor.block;
      return;
    }
  }
}

// The batches of responses past their response_ttl (1.3), after the expired keys, until none
// is left or the run must stop. The keys stay (tombstones); only their responses go.
void drop_expired_responses(const Request& request, TimestampTz started, Throttle& throttle,
                            Progress& progress) {
  if (!stats::responses_may_expire(MyDatabaseId)) return;
  for (;;) {
    const int rows = throttle.start_batch(request.batch_size);
    statements::Batch done;
    const Step step = in_transaction(
        request, progress, "idempotency cleanup: dropping a batch of expired responses",
        [&](const caller::Installation& installation) {
          done = statements::drop_responses(installation.table, request.now, rows);
        });
    if (step == Step::kPaused) progress.paused = true;
    if (step != Step::kDone || !done.full) return;
    pause(throttle, done.deleted, progress);
    if (should_stop(request, started)) {
      progress.unfinished = true;
      return;
    }
  }
}

}  // namespace

void run(const Request& request, Progress& progress) {
  const TimestampTz started = GetCurrentTimestamp();
  Oid table = InvalidOid;
  const Step look =
      in_transaction(request, progress, "idempotency cleanup: looking for the extension",
                     [&](const caller::Installation& found) { table = found.table; });
  if (look == Step::kPaused) progress.paused = true;
  if (look != Step::kDone) {
    if (look == Step::kNotInstalled && OidIsValid(request.table))
      throw Error(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                  "idempotency_cleanup() finds no committed installation of the extension",
                  "The deletions run in a transaction of their own, which sees only what is "
                  "committed.");
    return;
  }
  progress.installed = true;
  Throttle throttle(request.requester);
  // Expired keys first, every round, whatever happens to roles; then the pass over keys of
  // dropped roles, with the time left (it resumes where it stopped in the next round).
  delete_expired_keys(request, started, throttle, progress);
  if (progress.paused || progress.unfinished) return;
  drop_expired_responses(request, started, throttle, progress);
  if (progress.paused || progress.unfinished) return;
  (void)delete_orphans(request, table, started, throttle, progress);
}

void abort_failed_batch() noexcept {
  try {
    worker_session::disarm_batch_deadline();
    // Leaves the failed transaction (and its SPI connection and snapshot).
    pg::transactions::abort();
    pgstat_report_activity(STATE_IDLE, nullptr);
  } catch (...) {
  }
}

}  // namespace idem::cleanup
