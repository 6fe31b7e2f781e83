// The session of a cleanup worker process (the database workers of the launcher and the
// worker of idempotency_cleanup()): how it stops, and which settings it runs with.
//
// A database's owner can ALTER DATABASE ... SET any user-settable parameter, and a background
// worker connecting to the database takes those settings as a login would (so do settings of
// roles, ALTER ROLE ... SET). Settings such as default_transaction_isolation = serializable
// with default_transaction_read_only and default_transaction_deferrable made every worker
// wait for a safe snapshot, which any open serializable transaction in the cluster delays
// without end, and with four such databases every worker slot waited. So a worker:
//   - pins what its batches depend on before it connects, at a priority that the
//     database's and role's settings cannot override: READ COMMITTED, read-write, not
//     deferrable, a short lock_timeout (also while connecting), synchronous_commit = local;
//   - after connecting, sets every other parameter that a database or role setting changed
//     back to the value the server started the worker with (postgresql.conf, ALTER SYSTEM):
//     planner switches, work_mem, role, temp_tablespaces, session_replication_role, ...;
//   - bounds each batch by its own deadline (kBatchTimeoutMs): statement_timeout is armed
//     only for client statements, never in a background worker.
// A batch that cannot progress (a lock held by someone, a slow statement) then fails within
// seconds, the round is recorded as failed and retried at the next interval, and the worker
// slot is free again for the other databases.
#pragma once

#include "pg.hpp"

namespace idem::worker_session {

// How long one batch transaction may take, and one lock wait in it.
constexpr int kBatchTimeoutMs = 10 * 1000;
constexpr int kLockTimeoutMs = 1000;

// Installs the signal handlers: SIGTERM asks the process to stop (a flag, and, once
// cancel_on_stop() has been called, a cancel of the statement under way so that it stops
// within milliseconds); the caller finishes
// quietly and exits with 0, so a shutdown logs nothing above LOG. SIGHUP reloads.
void handle_signals();
// True once SIGTERM has arrived.
bool stop_requested();
// Called where the round's error handling takes a cancel for a stop: from here on SIGTERM
// also cancels the statement under way (before, it only sets the flag).
void cancel_on_stop();

// Before BackgroundWorkerInitializeConnectionByOid: pins the settings above and remembers
// the others' values.
void prepare_settings();
// After the connection: gives back the values remembered by prepare_settings() to every
// parameter a database or role setting changed. Runs its own transaction.
void undo_database_settings();

// Arms (and disarms) the deadline of one batch transaction; a batch past it gets
// 57014 "canceling statement due to statement timeout".
void arm_batch_deadline();
void disarm_batch_deadline();

}  // namespace idem::worker_session
