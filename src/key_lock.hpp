// The per-key transaction lock that tells an open claim apart from no claim at all.
//
// A claim takes an exclusive lock on (database, scope, key) without waiting and keeps it
// until its transaction ends. A second claimer that cannot get the lock knows that a
// transaction holding the key is still open (its row is not visible yet), and answers
// in_progress at once instead of waiting on the unique index. The lock lives in the lock
// manager of the node that runs the call, which is right under Citus too: every call for
// one key is delegated to the node holding its shard.
#pragma once

#include "pg.hpp"

namespace idem::key_lock {

enum class Outcome { kAcquired, kAlreadyHeld, kBusy };

// Tries to lock (scope, key) for the rest of the transaction.
Outcome try_lock(const char* scope, size_t scope_length, const char* key, size_t key_length);
// Gives back one acquisition that try_lock reported as kAcquired.
void unlock(const char* scope, size_t scope_length, const char* key, size_t key_length);

}  // namespace idem::key_lock
