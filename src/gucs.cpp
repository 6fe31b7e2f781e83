// GUC definitions. Units let users write '24h' or '5min'; bounds make PostgreSQL reject a
// bad value with a clear message (SQLSTATE 22023) before our code ever sees it.
#include "gucs.hpp"

#include "pg.hpp"

namespace idem::gucs {

int default_ttl_seconds = 24 * 60 * 60;
int default_lease_seconds = 5 * 60;
int max_key_length = 255;
int max_response_size = 1024 * 1024;
int max_ttl_seconds = 30 * 24 * 60 * 60;
int max_lease_seconds = 24 * 60 * 60;
int max_fingerprint_size = 64;
int max_recovery_point_size = 1024;
int cleanup_interval_ms = 60 * 1000;
int cleanup_batch_size = 5000;
int cleanup_delay_ms = 5;
int cleanup_cost_limit = 200;
int cleanup_cpu_share = 100;
char* databases = nullptr;
bool executor_path = false;
bool result_scan = true;
int wait_recheck_ms = 200;
bool cleanup_worker = true;

namespace {
// Accepts '' or a comma-separated list of plain database names.
bool check_databases(char** newval, void** /*extra*/, GucSource /*source*/) {
  if (*newval == nullptr) return true;
  for (const char* p = *newval; *p; ++p) {
    if (*p == '"' || *p == '\'') {
      GUC_check_errdetail("List database names separated by commas, without quotes.");
      return false;
    }
  }
  return true;
}

// The settings of the cleanup: the worker's rounds, the batches and their throttle.
// pg-frame: called by define() only, under _PG_init (PostgreSQL's frame); owns no C++ object.
void define_cleanup() {
  DefineCustomIntVariable("idempotency.cleanup_interval",
                          "Time between two cleanup rounds of the background worker.", nullptr,
                          &cleanup_interval_ms, 60 * 1000, 100, 24 * 60 * 60 * 1000, PGC_SIGHUP,
                          GUC_UNIT_MS, nullptr, nullptr, nullptr);
  DefineCustomIntVariable(
      "idempotency.cleanup_batch_size", "Expired keys deleted per transaction by the cleanup.",
      nullptr, &cleanup_batch_size, 5000, 1, 1000000, PGC_SIGHUP, 0, nullptr, nullptr, nullptr);
  // The throttle of the cleanup (cleanup_throttle.hpp), as vacuum_cost_delay and
  // vacuum_cost_limit pace a vacuum, and only while other sessions work.
  DefineCustomIntVariable(
      "idempotency.cleanup_delay",
      "Pause of the cleanup once it has spent idempotency.cleanup_cost_limit while other "
      "sessions work.",
      "Leaves CPU and WAL bandwidth to the sessions while a large backlog is deleted; 0 = none.",
      &cleanup_delay_ms, 5, 0, 1000, PGC_SIGHUP, GUC_UNIT_MS, nullptr, nullptr, nullptr);
  DefineCustomIntVariable(
      "idempotency.cleanup_cost_limit",
      "Cost the cleanup spends between two pauses while other sessions work.",
      "Counted as vacuum counts it (vacuum_cost_page_hit, _miss, _dirty); a batch is cut to "
      "what it buys. Where nobody else works, the cleanup does not pause.",
      &cleanup_cost_limit, 200, 1, 10000, PGC_SIGHUP, 0, nullptr, nullptr, nullptr);
  DefineCustomIntVariable(
      "idempotency.cleanup_cpu_share",
      "Most of a CPU, in percent, the cleanup uses while other sessions work.",
      "Measured on the process's CPU clock, every batch's fixed work included; after a batch "
      "the cleanup pauses long enough to stay under it. 100 = no such limit.",
      &cleanup_cpu_share, 100, 1, 100, PGC_SIGHUP, 0, nullptr, nullptr, nullptr);
  DefineCustomStringVariable("idempotency.databases",
                             "Databases the cleanup worker serves (empty: every database).",
                             "A comma-separated list of database names.", &databases, "",
                             PGC_SIGHUP, 0, check_databases, nullptr, nullptr);
  // Superuser-only, so that no database owner can stop the cleanup of his database (the
  // worker reads a database's setting from pg_db_role_setting itself, before and after every
  // batch, whatever the settings it runs with: cleanup.cpp).
  DefineCustomBoolVariable(
      "idempotency.cleanup_worker", "Whether the background worker cleans up.",
      "off in postgresql.conf: in no database; ALTER DATABASE ... SET "
      "idempotency.cleanup_worker = off: not in that one. idempotency_cleanup() works either way.",
      &cleanup_worker, true, PGC_SUSET, 0, nullptr, nullptr, nullptr);
}

}  // namespace

// pg-frame: called by _PG_init only (PostgreSQL's frame, where an error ends the load); owns
// no C++ object.
void define() {
  // The defaults decide how long another role's keys live when its handler passes no ttl or
  // lease: a database owner's ALTER DATABASE ... SET must not shorten them (a retry two
  // seconds later would run the request again), so only a superuser (or a role granted SET
  // on the parameter) sets them.
  DefineCustomIntVariable(
      "idempotency.default_ttl", "How long a key is kept when claim_key is given no ttl.",
      "A completed key is kept this long after completion.", &default_ttl_seconds, 24 * 60 * 60, 1,
      INT_MAX, PGC_SUSET, GUC_UNIT_S, nullptr, nullptr, nullptr);
  DefineCustomIntVariable(
      "idempotency.default_lease", "How long a claim is held when claim_key is given no lease.",
      "After the lease ends without complete_key, another caller may reclaim the key.",
      &default_lease_seconds, 5 * 60, 1, INT_MAX, PGC_SUSET, GUC_UNIT_S, nullptr, nullptr, nullptr);
  DefineCustomIntVariable("idempotency.max_key_length", "Longest accepted key, in bytes.", nullptr,
                          &max_key_length, 255, 1, kKeyLengthCeiling, PGC_SUSET, 0, nullptr,
                          nullptr, nullptr);
  DefineCustomIntVariable(
      "idempotency.max_response_size", "Largest accepted stored response, in bytes.",
      "The jsonb response, the body and the headers together.", &max_response_size, 1024 * 1024, 1,
      MaxAllocSize / 2, PGC_SUSET, GUC_UNIT_BYTE, nullptr, nullptr, nullptr);
  // Every role that may call claim_key stores rows in a table it does not own: each value
  // is bounded, and the bounds are for superusers to set (PGC_SUSET).
  DefineCustomIntVariable("idempotency.max_ttl", "Longest ttl a claim may ask for.",
                          "Also bounds idempotency.default_ttl.", &max_ttl_seconds,
                          30 * 24 * 60 * 60, 1, INT_MAX, PGC_SUSET, GUC_UNIT_S, nullptr, nullptr,
                          nullptr);
  DefineCustomIntVariable(
      "idempotency.max_lease", "Longest lease a claim or checkpoint may ask for.",
      "Also bounds idempotency.default_lease.", &max_lease_seconds, 24 * 60 * 60, 1, INT_MAX,
      PGC_SUSET, GUC_UNIT_S, nullptr, nullptr, nullptr);
  DefineCustomIntVariable("idempotency.max_fingerprint_size",
                          "Largest accepted request fingerprint, in bytes.",
                          "request_fingerprint() gives 32 bytes (SHA-256).", &max_fingerprint_size,
                          64, 1, 1024, PGC_SUSET, GUC_UNIT_BYTE, nullptr, nullptr, nullptr);
  DefineCustomIntVariable("idempotency.max_recovery_point_size",
                          "Largest accepted recovery point of checkpoint_key, in bytes.", nullptr,
                          &max_recovery_point_size, 1024, 1, 1024 * 1024, PGC_SUSET, GUC_UNIT_BYTE,
                          nullptr, nullptr, nullptr);
  // A superuser's switch: every claim of the session through the kept SPI plans, as on
  // Citus, so that the tests of the claim core cover that path too (test/paths).
  DefineCustomBoolVariable(
      "idempotency.executor_path",
      "Route every claim through the executor (SPI) instead of the direct heap path; for tests "
      "and diagnosis.",
      nullptr, &executor_path, false, PGC_SUSET, 0, nullptr, nullptr, nullptr);
  // Any role's switch: it only chooses between two plans that return the same rows.
  DefineCustomBoolVariable(
      "idempotency.result_scan",
      "Run claim_key and complete_key in FROM with the extension's scan, which takes the "
      "function's row as it is.",
      "off: PostgreSQL's function scan, which copies the row through a tuplestore.", &result_scan,
      true, PGC_USERSET, 0, nullptr, nullptr, nullptr);
  // Superuser-only: a long interval leaves a waiter asleep where only the safety net wakes it
  // (a prepared holder, a lease that runs out). The tests set it to tell a wake-up by the
  // holder's end from the safety net by events instead of by the clock (test/t/046).
  DefineCustomIntVariable(
      "idempotency.wait_recheck_interval",
      "Longest sleep of a waiting claim without a wake-up before it looks at its key again.",
      "The safety net for holders that end without waking their waiters; for tests and "
      "diagnosis.",
      &wait_recheck_ms, 200, 1, 24 * 60 * 60 * 1000, PGC_SUSET, GUC_UNIT_MS, nullptr, nullptr,
      nullptr);
  define_cleanup();
  MarkGUCPrefixReserved("idempotency");
}

}  // namespace idem::gucs
