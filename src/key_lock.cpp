// The per-key transaction lock (see key_lock.hpp).
#include "key_lock.hpp"

#include "pg_boundary.hpp"

namespace idem::key_lock {
namespace {

// Advisory locks taken by pg_advisory_lock() use 1 and 2 in the last tag field; ours use
// another value, so an application's advisory locks never collide with key locks.
constexpr uint16 kKeyLockSpace = 0x1de7;

LOCKTAG tag_of(const char* scope, size_t scope_length, const char* key, size_t key_length) {
  // Hash scope and key as one string with a separator that cannot end a scope prefix
  // ambiguously: the scope's length is part of the seed.
  uint64 hash = hash_bytes_extended(reinterpret_cast<const unsigned char*>(key),
                                    static_cast<int>(key_length), scope_length);
  hash = hash_combine64(hash, hash_bytes_extended(reinterpret_cast<const unsigned char*>(scope),
                                                  static_cast<int>(scope_length), 0x1de7));
  LOCKTAG tag;
  SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, static_cast<uint32>(hash >> 32),
                       static_cast<uint32>(hash), kKeyLockSpace);
  return tag;
}

}  // namespace

Outcome try_lock(const char* scope, size_t scope_length, const char* key, size_t key_length) {
  LOCKTAG tag = tag_of(scope, scope_length, key, key_length);
  LockAcquireResult result = pg_call([&] { return LockAcquire(&tag, ExclusiveLock, false, true); });
  switch (result) {
    case LOCKACQUIRE_NOT_AVAIL:
      return Outcome::kBusy;
    case LOCKACQUIRE_ALREADY_HELD:
    case LOCKACQUIRE_ALREADY_CLEAR:
      return Outcome::kAlreadyHeld;
    default:
      return Outcome::kAcquired;
  }
}

void unlock(const char* scope, size_t scope_length, const char* key, size_t key_length) {
  LOCKTAG tag = tag_of(scope, scope_length, key, key_length);
  pg_call([&] { LockRelease(&tag, ExclusiveLock, false); });
}

}  // namespace idem::key_lock
