// The per-key transaction lock (see key_lock.hpp).
#include "key_lock.hpp"

#include "pg_boundary.hpp"
#include "sha256.hpp"
#include "pg/heap.hpp"
#include "pg/locks.hpp"

namespace idem::key_lock {
namespace {

// Advisory locks taken by pg_advisory_lock() use 1 and 2 in the last tag field; ours use
// another value, so an application's advisory locks never collide with key locks.
constexpr uint16 kKeyLockSpace = 0x1de7;

// The salt of one installation, read once per backend (keyed by the table's OID, which a
// new CREATE EXTENSION changes).
struct Salt {
  Oid table = InvalidOid;
  uint8 bytes[64] = {};
  size_t length = 0;
};
Salt salt;

const Salt& salt_of(Oid table) {
  if (salt.table == table) return salt;
  Salt loaded;
  loaded.length = pg::heap::first_bytea(table, "key_lock_salt", loaded.bytes, sizeof loaded.bytes);
  if (loaded.length < 16)
    throw Error(ERRCODE_DATA_CORRUPTED, "key_lock_salt holds no salt", {},
                "Drop and create the extension idempotency again.");
  loaded.table = table;
  salt = loaded;
  return salt;
}

LOCKTAG tag_of(const KeyIdentity& identity) {
  // Every part is length-prefixed, so no two identities give the same digest input.
  const Salt& secret = salt_of(identity.table);
  Sha256 sha;
  sha.update(secret.bytes, secret.length);
  const uint32 owner = identity.owner;
  sha.update(&owner, sizeof owner);
  const uint64 scope_length = identity.scope_length;
  sha.update(&scope_length, sizeof scope_length);
  sha.update(identity.scope, identity.scope_length);
  sha.update(identity.key, identity.key_length);
  uint8 digest[PG_SHA256_DIGEST_LENGTH];
  sha.finish_into(digest);
  uint32 high = 0;
  uint32 low = 0;
  uint16 extra = 0;
  memcpy(&high, digest, sizeof high);
  memcpy(&low, digest + 4, sizeof low);
  memcpy(&extra, digest + 8, sizeof extra);
  // The last field tells our locks from pg_advisory_lock()'s (1 and 2): its top bits are
  // ours, its low byte comes from the digest.
  LOCKTAG tag;
  SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, high, low,
                       static_cast<uint16>((kKeyLockSpace & 0xff00) | (extra & 0x00ff)));
  return tag;
}

}  // namespace

Outcome try_lock(const KeyIdentity& identity) {
  LOCKTAG tag = tag_of(identity);
  const LockAcquireResult result = pg::locks::try_acquire(tag, ExclusiveLock);
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

void unlock(const KeyIdentity& identity) {
  LOCKTAG tag = tag_of(identity);
  pg::locks::release(tag, ExclusiveLock);
}

}  // namespace idem::key_lock
