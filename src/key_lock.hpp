// The per-key transaction lock that tells an open claim apart from no claim at all.
//
// A claim takes an exclusive lock on (database, owner, scope, key) without waiting and keeps
// it until its transaction ends. A second claimer that cannot get the lock knows that a
// transaction holding the key is still open (its row is not visible yet), and answers
// in_progress at once instead of waiting on the unique index. The lock lives in the lock
// manager of the node that runs the call, which is right under Citus too: every call for
// one key is delegated to the node holding its shard.
//
// The lock tag holds 72 bits of a SHA-256 over a secret salt and the key's identity. The
// owner is part of the identity, so one role's open claim never makes another role's claim
// of the same (scope, key) answer in_progress. The digest is keyed because pg_locks shows
// every lock tag to every role: without the salt (a random value in the superuser-only
// table key_lock_salt, made by CREATE EXTENSION), a role could compute the tag of a key it
// guesses and watch pg_locks to learn that another role has it in flight, or pick a key of
// its own whose tag collides with it, to block it.
#pragma once

#include "pg.hpp"

namespace idem::key_lock {

enum class Outcome { kAcquired, kAlreadyHeld, kBusy };

// The identity of one key: whose it is, its scope and its bytes.
struct KeyIdentity {
  Oid table;  // the installation's idempotency_keys: its schema holds the salt
  Oid owner;
  const char* scope;
  size_t scope_length;
  const char* key;
  size_t key_length;
};

// Tries to lock the key for the rest of the transaction.
Outcome try_lock(const KeyIdentity& identity);
// Gives back one acquisition that try_lock reported as kAcquired.
void unlock(const KeyIdentity& identity);

}  // namespace idem::key_lock
