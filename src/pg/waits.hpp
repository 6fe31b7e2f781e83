// Sleeping: on a condition variable or on the latch. Every wrapper catches (pg_call): an
// interrupt (cancel, timeout, termination) that arrives meanwhile comes back as PgError.
#pragma once

#include "../pg_boundary.hpp"

namespace idem::pg::waits {

// Sleeps on `variable` (prepared with ConditionVariablePrepareToSleep) until it is signalled
// or `timeout_ms` passed. Raises on an interrupt. Allocates nothing.
inline void on_condition_variable(ConditionVariable* variable, long timeout_ms) {
  pg_call([&] { (void)ConditionVariableTimedSleep(variable, timeout_ms, PG_WAIT_EXTENSION); });
}
// Sleeps on this backend's latch for up to `timeout_ms`, then resets it and serves pending
// interrupts. Raises on an interrupt; exits with the postmaster. Allocates nothing.
inline void on_latch(long timeout_ms) {
  pg_call([&] {
    (void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, timeout_ms,
                    PG_WAIT_EXTENSION);
    ResetLatch(MyLatch);
    CHECK_FOR_INTERRUPTS();
  });
}

// Sleeps on this backend's latch for up to `timeout_ms`, then resets it; pending interrupts
// are left to the caller (InterruptPending tells). Exits with the postmaster. Raises (a wait
// event set failure). Allocates nothing.
inline void on_latch_leaving_interrupts(long timeout_ms) {
  pg_call([&] {
    (void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, timeout_ms,
                    PG_WAIT_EXTENSION);
    ResetLatch(MyLatch);
  });
}

}  // namespace idem::pg::waits
