// The pace of the cleanup's batches (cleanup.hpp), the way autovacuum paces itself: every batch
// has a cost, counted as vacuum counts it (each shared buffer found costs vacuum_cost_page_hit,
// each read vacuum_cost_page_miss, each dirtied vacuum_cost_page_dirty: the server's own
// settings), and while other sessions work the cleanup spends at most
// idempotency.cleanup_cost_limit before it pauses idempotency.cleanup_delay.
//
// Why (bench/cleanup_bench.sh, docs/benchmarks.md): claims running beside a large cleanup lose
// CPU to it, and wait on WAL: its deletions write a full-page image of every heap page first
// touched after a checkpoint and a record per row locked and deleted, and the claims' commits
// then wait for those insertions (WALInsert), for WAL buffers to be recycled (WALBufMapping) and
// for bigger writes (WALWrite). One batch of 5000 keys was a burst of about 10 ms of a core
// and 1.3 MB of WAL, followed by a pause as long: a claim that came during a burst waited for
// it. So while other sessions work, a batch is cut to what one budget buys (at the default
// limit of 200, about 50 keys, whose deletions are a tenth of a millisecond; with the
// batch's fixed work about 0.3 ms of CPU, measured in 2026-12) and followed by a pause of
// cleanup_delay; on a server where nobody else works, batches are batch_size
// keys and follow each other without pause.
//
// The budget counts buffers, not the work every batch does whatever its size (a transaction,
// a snapshot, the installation's lookup, the statement's executor, a commit): at about 50 keys
// a batch that fixed work is most of a batch's CPU, and on a slower machine the same budget
// takes a larger share of a core. So while other sessions work the pause is also long enough
// that the process's CPU time since its last pause (for the first, since the run started) is
// at most idempotency.cleanup_cpu_share percent of the time (100 by default: no limit): the
// batches' share of a core stays bounded on any machine, measured on the process's CPU clock (which
// does not count the time it waits for a core on a loaded machine). The process's start is not
// charged: a process runs rounds for up to 10 s while keys are left, whatever the pauses, so a
// pause for it would only cut the batches, not the starts (bench/cleanup_bench.sh prints their
// CPU).
//
// Other sessions work when, since the cleanup's last look, another transaction took a
// transaction ID anywhere on the server (a write), or when, at the look, another backend of
// the database holds a snapshot (a statement under way; neither the backend that waits for
// idempotency_cleanup() nor autovacuum's workers and vacuums count). Either sign counts for
// kBusyHoldMs: a stream of claims has gaps between its statements. The first batch of a run,
// before anything was seen, is sized as a busy one.
#pragma once

#include "pg.hpp"

namespace idem::cleanup {

// The pause after a batch that cost `cost` while other sessions work: cleanup_delay scaled by
// the share of the budget the batch spent (vacuum_delay_point's rule), at most kMaxPauseMs;
// none on a server where nobody else works, or with a delay of 0.
int pause_ms(double cost, bool busy, int cost_limit, int delay_ms);

// The pause after work that took `cpu_us` of the process's CPU time since its last pause,
// while others work: long enough that this CPU time is share_percent of the whole (work and
// pause), at most kMaxPauseMs; none at 100 percent, where nobody else works, or for no CPU.
int cpu_pause_ms(int64 cpu_us, bool busy, int share_percent);

// The keys the next batch may delete: batch_size where nobody else works; while others work,
// what one budget buys at the cost per key measured so far (at least 1, at most batch_size).
int batch_rows(bool busy, int batch_size, int cost_limit, double cost_per_key);

class Throttle {
 public:
  // `requester`: the backend that waits for idempotency_cleanup() (0: none), not counted as
  // another session at work.
  explicit Throttle(pid_t requester);

  // Before a batch: the keys it may delete (batch_rows()); remembers the buffer counters.
  int start_batch(int batch_size);
  // After a batch that deleted `deleted` keys: its cost, a look at the other sessions, and the
  // pause that calls for, slept on the process latch (a stop request wakes it).
  void pause_after_batch(uint64 deleted);

  // The CPU time this process has used so far, in microseconds (0 if unknown).
  static int64 cpu_now_us();

  // For the round's summary: pauses made and their total length.
  int pauses() const { return pauses_; }
  int64 paused_ms() const { return paused_ms_; }

 private:
  bool others_work();
  double cost_since_start() const;

  pid_t requester_;
  bool seen_ = false;            // a look was taken: busy_until_ is meaningful
  TimestampTz busy_until_ = 0;   // other sessions count as working until then
  FullTransactionId next_xid_;   // at the last look
  uint64 own_transactions_ = 0;  // batches since the last look (a transaction ID each)
  double cost_per_key_ = 0;      // of the last batch that deleted keys; 0: unknown
  int64 hits_ = 0, misses_ = 0, dirtied_ = 0;  // the buffer counters at the batch's start
  TimestampTz batch_started_ = 0;              // the clock at the batch's start
  int64 batch_cpu_started_us_ = 0;             // the process's CPU time then
  int64 cpu_at_pause_end_us_ = 0;              // at the last pause's end (or the run's start)
  // What the last look saw (logged): transaction IDs others took since the look before, and
  // backends of the database with a snapshot.
  uint64 others_xids_ = 0;
  int others_snapshots_ = 0;
  int batches_ = 0;  // batches of the run so far
  int pauses_ = 0;
  int64 paused_ms_ = 0;
};

}  // namespace idem::cleanup
