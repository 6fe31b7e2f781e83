// The pace of the cleanup's batches (cleanup_throttle.hpp).
#include "cleanup_throttle.hpp"

#include <time.h>

#include <algorithm>
#include <cmath>

#include "gucs.hpp"
#include "pg/errors.hpp"
#include "pg/transactions.hpp"
#include "pg/waits.hpp"
#include "pg_boundary.hpp"
#include "worker_session.hpp"

namespace idem::cleanup {
namespace {

// The longest pause after one batch (a batch far over the budget, or a large delay).
constexpr int kMaxPauseMs = 1000;
// How long a sign of other sessions' work counts.
constexpr int64 kBusyHoldMs = 1000;
// The cost of deleting one key before a batch has measured it: a lock and a deletion of a row
// found by the index (a few buffers found), and a share of a dirtied heap page (about 32 keys
// a page, vacuum_cost_page_dirty = 20).
constexpr double kFirstCostPerKey = 4;

}  // namespace

int pause_ms(double cost, bool busy, int cost_limit, int delay_ms) {
  if (!busy || delay_ms <= 0 || cost <= 0) return 0;
  const double pause = static_cast<double>(delay_ms) * cost / std::max(cost_limit, 1);
  return static_cast<int>(std::min<double>(std::ceil(pause), kMaxPauseMs));
}

int cpu_pause_ms(int64 cpu_us, bool busy, int share_percent) {
  if (!busy || share_percent >= 100 || cpu_us <= 0) return 0;
  const double pause_us =
      static_cast<double>(cpu_us) * (100 - share_percent) / std::max(share_percent, 1);
  return static_cast<int>(std::min<double>(std::ceil(pause_us / 1000), kMaxPauseMs));
}

int batch_rows(bool busy, int batch_size, int cost_limit, double cost_per_key) {
  if (!busy) return batch_size;
  const double per_key = cost_per_key > 0 ? cost_per_key : kFirstCostPerKey;
  const double rows = std::floor(std::max(cost_limit, 1) / per_key);
  return static_cast<int>(std::clamp<double>(rows, 1, batch_size));
}

Throttle::Throttle(pid_t requester)
    : requester_(requester),
      next_xid_(ReadNextFullTransactionId()),
      cpu_at_pause_end_us_(cpu_now_us()) {}

// The CPU time this process has used, in microseconds (0 if the clock cannot be read).
int64 Throttle::cpu_now_us() {
  timespec now{};
  if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now) != 0) return 0;
  return int64{now.tv_sec} * 1000000 + now.tv_nsec / 1000;
}

int Throttle::start_batch(int batch_size) {
  batch_started_ = GetCurrentTimestamp();
  batch_cpu_started_us_ = cpu_now_us();
  hits_ = pgBufferUsage.shared_blks_hit;
  misses_ = pgBufferUsage.shared_blks_read;
  dirtied_ = pgBufferUsage.shared_blks_dirtied;
  // Nothing seen yet: sized as a busy batch, whose end tells.
  const bool busy = !seen_ || GetCurrentTimestamp() < busy_until_;
  return batch_rows(busy, batch_size, gucs::cleanup_cost_limit, cost_per_key_);
}

double Throttle::cost_since_start() const {
  return static_cast<double>(pgBufferUsage.shared_blks_hit - hits_) * VacuumCostPageHit +
         static_cast<double>(pgBufferUsage.shared_blks_read - misses_) * VacuumCostPageMiss +
         static_cast<double>(pgBufferUsage.shared_blks_dirtied - dirtied_) * VacuumCostPageDirty;
}

// Looks at the other sessions (see the header); true while they count as working.
bool Throttle::others_work() {
  const FullTransactionId next = ReadNextFullTransactionId();
  // Each batch since the last look took at most one transaction ID.
  const uint64 taken = U64FromFullTransactionId(next) - U64FromFullTransactionId(next_xid_);
  const bool wrote = taken > own_transactions_;
  others_xids_ = wrote ? taken - own_transactions_ : 0;
  next_xid_ = next;
  own_transactions_ = 0;
  // The backends of this database with a snapshot, other than this one, the requester and
  // autovacuum's workers and vacuums (maintenance that paces itself, not the sessions' work).
  others_snapshots_ = pg::transactions::other_snapshots(requester_);
  const bool running = others_snapshots_ > 0;
  const TimestampTz now = GetCurrentTimestamp();
  if (wrote || running) busy_until_ = now + kBusyHoldMs * 1000;
  seen_ = true;
  return now < busy_until_;
}

void Throttle::pause_after_batch(uint64 deleted) {
  const double cost = cost_since_start();
  const int64 took_us = GetCurrentTimestamp() - batch_started_;
  const int64 cpu_us = cpu_now_us() - batch_cpu_started_us_;
  ++batches_;
  if (deleted > 0) cost_per_key_ = cost / static_cast<double>(deleted);
  ++own_transactions_;
  const bool busy = others_work();
  // The CPU time since the last pause ended (the first time: since the run started): the
  // batch with its transaction, lookups and commit, and the look.
  const int64 cpu_charged_us = cpu_now_us() - cpu_at_pause_end_us_;
  const int cost_pause = pause_ms(cost, busy, gucs::cleanup_cost_limit, gucs::cleanup_delay_ms);
  const int cpu_pause = cpu_pause_ms(cpu_charged_us, busy, gucs::cleanup_cpu_share);
  const int delay_ms = std::max(cost_pause, cpu_pause);
  char line[512];
  snprintf(line, sizeof line,
           "idempotency cleanup: batch of " UINT64_FORMAT
           " keys, cost %.0f, other sessions %s, pause %d ms; took %ld us, "
           "%ld us on CPU; seen: " UINT64_FORMAT
           " transactions of others, %d snapshots; batch %d of the run; "
           "CPU since the last pause %ld us, pause for the CPU share %d ms",
           deleted, cost, busy ? "working" : "idle", delay_ms, static_cast<long>(took_us),
           static_cast<long>(cpu_us), others_xids_, others_snapshots_, batches_,
           static_cast<long>(cpu_charged_us), cpu_pause);
  pg::errors::report(DEBUG2, line);
  // The whole pause: a latch set for anything but a stop (a reload, a catch-up interrupt)
  // does not shorten it.
  const TimestampTz until = GetCurrentTimestamp() + int64{delay_ms} * 1000;
  for (long left = delay_ms; left > 0 && !worker_session::stop_requested() && !InterruptPending;
       left = static_cast<long>((until - GetCurrentTimestamp() + 999) / 1000))
    pg::waits::on_latch_leaving_interrupts(left);
  cpu_at_pause_end_us_ = cpu_now_us();
  if (delay_ms > 0) {
    ++pauses_;
    paused_ms_ += delay_ms;
  }
}

}  // namespace idem::cleanup
