// The configuration parameters (GUCs) of the extension, all under "idempotency.".
#pragma once

namespace idem::gucs {

// Defined once per process, from _PG_init.
void define();

// Read by the claim protocol (seconds / bytes); reloadable, validated by PostgreSQL.
extern int default_ttl_seconds;
extern int default_lease_seconds;
extern int max_key_length;
extern int max_response_size;
// Upper bounds of what one role may store (SPEC §7): superuser-only settings.
extern int max_ttl_seconds;
extern int max_lease_seconds;
extern int max_fingerprint_size;
extern int max_recovery_point_size;

// The largest key (and scope) length a superuser may allow: the primary key entry
// (owner, scope, key) must fit a B-Tree page's item limit (2704 bytes with 8 kB pages).
constexpr int kKeyLengthCeiling = 1024;

// idempotency.executor_path: every claim through the executor (route::direct_path()).
extern bool executor_path;

// idempotency.result_scan: claim_key / complete_key in FROM run by our scan (result_scan.hpp).
extern bool result_scan;

// idempotency.wait_recheck_interval: the longest a waiting claim sleeps without a wake-up
// before it looks at its key again (key_wait.hpp's safety net).
extern int wait_recheck_ms;

// Read by the cleanup worker.
extern int cleanup_interval_ms;
extern int cleanup_batch_size;
extern int cleanup_delay_ms;    // the throttle's pause once its budget is spent
extern int cleanup_cost_limit;  // the throttle's budget between two pauses
extern int cleanup_cpu_share;   // the throttle's most of a CPU (%) while others work
extern char* databases;         // comma-separated list, empty = every database
extern bool cleanup_worker;     // off: the worker leaves the server (or a database) alone

}  // namespace idem::gucs
