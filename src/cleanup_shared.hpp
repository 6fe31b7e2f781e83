// What the cleanup launcher, its database workers and the sessions share (SPEC §5), in
// shared memory (shared_preload_libraries only):
//   - the role generation: a counter bumped when a role vanished (was dropped or renamed),
//     the only changes of pg_authid that can orphan keys. A cleanup runs its pass over keys
//     of dropped or renamed roles only when the counter moved since that database's last
//     complete pass, so that with no role dropped a round costs the same with 10 or 10,000
//     owners, and no other change of pg_authid (a password, which any role with LOGIN can set
//     in a loop) starts one. Every process counts the pg_authid changes it learns of (a
//     syscache callback on AUTHOID); the launcher, which reads the invalidation queue every
//     round, then compares a keyed fingerprint of pg_authid's (OID, name) pairs with the last
//     one and bumps the counter only if a pair vanished; the process that runs DROP ROLE or a
//     role's RENAME bumps it at its commit too (a ProcessUtility hook), so that a cleanup right
//     after that commit sees the drop whatever the launcher saw. A change the launcher has not
//     looked at yet makes an idempotency_cleanup() call run the pass (role_change_pending());
//     without a launcher every cleanup makes the pass;
//   - the extension generation: bumped at the commit of every CREATE EXTENSION idempotency
//     (a ProcessUtility hook), so that the launcher looks again at databases it found
//     without the extension only when one may have it now;
//   - the registry of database workers: which database each runs for and its pid. It
//     outlives the launcher, so a launcher started again finds the workers still running
//     and starts no second one for their databases;
//   - the launcher's latch, set when a worker ends or an extension is created.
#pragma once

#include "pg.hpp"

namespace idem::cleanup_shared {

// Database workers at the same time: a few, so that many databases are served quickly
// without taking every max_worker_processes slot.
constexpr int kMaxWorkers = 4;

// How a database worker's round ended, as the launcher reads it from the registry.
enum class Outcome : int {
  kStarting,      // registered, not (yet) running: a worker that never started stays so
  kRunning,       // running, no outcome yet (a worker that dies leaves this)
  kDone,          // the round finished
  kUnfinished,    // the round stopped after its time with keys left: start the next at once
  kNotInstalled,  // the database has no extension idempotency
  kPaused,        // idempotency.cleanup_worker = off for this database
  kFailed,        // the round failed (logged, recorded in idempotency_stats)
};

// Called from _PG_init under shared_preload_libraries: asks for the shared memory, registers
// the pg_authid callback and the CREATE EXTENSION hook (both inherited by every backend).
void install();
bool available();

// The current role generation; 0 without shared memory (then every cleanup runs the pass).
uint64 role_generation();
// A pg_authid change was counted that the launcher has not looked at yet.
bool role_change_pending();
// The current extension generation; 0 without shared memory.
uint64 extension_generation();

// The launcher process registers itself (its latch is set by the events above) and is
// forgotten when it exits.
void become_launcher();
// Sets the launcher's latch, if a launcher runs.
void wake_launcher();
// True while a launcher runs (it follows pg_authid for the role generation).
bool launcher_running();
// Launcher, in a transaction: after a cache reset (and at its start), reads pg_authid and
// bumps the role generation if a role of the last reading is gone.
void check_roles();

// One registry entry as the launcher sees it.
struct Entry {
  Oid database = InvalidOid;  // InvalidOid: free
  uint64 ticket = 0;          // names the registration: a worker checks it is its own
  pid_t pid = 0;              // 0 until the worker runs, and again once it has exited
  bool exited = false;        // the worker has run and exited (outcome is final)
  Outcome outcome = Outcome::kStarting;
  TimestampTz reserved_at = 0;
};

// Launcher: takes a free entry for `database`; -1 when all kMaxWorkers are taken.
int reserve(Oid database, uint64* ticket);
// Launcher: frees an entry whose worker has exited or never started.
void release(int index);
// Launcher: a copy of entry `index`.
Entry entry(int index);
// True when an entry holds `database`: a worker for it is starting or running.
bool serving(Oid database);

// Database worker: takes entry `index` if it is still the registration `ticket` for
// `database` (false otherwise: a stale registration, and the worker exits). On success the
// entry records this process until it exits, whatever way it exits.
bool take(int index, Oid database, uint64 ticket);
// Database worker: records how its round ended.
void set_outcome(Outcome outcome);

}  // namespace idem::cleanup_shared
