// Waiting for a key's holder without polling (SPEC §3.1, `wait` > 0; issue #15).
//
// With shared_preload_libraries, shared memory holds a small array of condition variables,
// one per slot of a keyed hash (SipHash-2-4, siphash.hpp, with a secret made at server start)
// of the database and the key's identity (owner, scope, key). A transaction that wrote
// a key (a claim, a completion, a release) remembers the key's slot; when it ends (commit or
// abort, after it became visible to others), it wakes every waiter of its slots. A waiter
// sleeps on its key's slot and looks at the key again when woken: a collision of two keys in
// one slot only costs an extra look. The sleep is bounded by the caller's `wait` and by a
// safety net, idempotency.wait_recheck_interval (200 ms; a transaction prepared with PREPARE
// TRANSACTION ends in another backend, which wakes nobody, and a lease runs out without any
// transaction), is interruptible, and never spins.
//
// Without preloading there is no shared memory: waiters poll with latch sleeps that back
// off from 1 ms to 50 ms, as before.
#pragma once

#include "pg.hpp"

namespace idem::key_wait {

// Called from _PG_init while the postmaster loads the library (shared_preload_libraries).
void install_shared_memory_hooks();
// Registers the transaction callback that wakes the waiters (every backend).
void on_load();

// The slot of a key of the current database (0 without shared memory).
uint32 slot_of(Oid owner, const char* scope, size_t scope_length, const char* key,
               size_t key_length);
// This transaction wrote a key of `slot`: its end wakes the slot's waiters.
void touched(uint32 slot);

// The waiting of one claim: prepare() before every look at the key, sleep() when it must
// wait. The destructor leaves the condition variable's wait list.
class Waiter {
 public:
  // `waits`: the claim may wait at all (its deadline is in the future).
  Waiter(uint32 slot, bool waits);
  ~Waiter();
  Waiter(const Waiter&) = delete;
  Waiter& operator=(const Waiter&) = delete;
  Waiter(Waiter&&) = delete;
  Waiter& operator=(Waiter&&) = delete;

  void prepare();
  // Sleeps until the key's slot is woken, the next poll, or `deadline`, whichever is first.
  void sleep(TimestampTz deadline);

 private:
  ConditionVariable* variable_ = nullptr;  // nullptr: poll
  bool prepared_ = false;
  int64 backoff_us_ = 1000;
};

}  // namespace idem::key_wait
