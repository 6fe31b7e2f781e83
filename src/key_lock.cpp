// The per-key transaction lock (see key_lock.hpp).
#include "key_lock.hpp"

#include "pg_boundary.hpp"
#include "sha256.hpp"

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
  pg_call([&] {
    Oid salt_table = get_relname_relid("key_lock_salt", get_rel_namespace(table));
    if (!OidIsValid(salt_table))
      ereport(ERROR, (errcode(ERRCODE_UNDEFINED_TABLE),
                      errmsg("key_lock_salt does not exist in the extension's schema"),
                      errhint("Drop and create the extension idempotency again.")));
    Relation relation = table_open(salt_table, AccessShareLock);
#if PG_VERSION_NUM >= 190000  // table_beginscan gained a flags argument
    TableScanDesc scan = table_beginscan(relation, GetLatestSnapshot(), 0, nullptr, SO_NONE);
#else
    TableScanDesc scan = table_beginscan(relation, GetLatestSnapshot(), 0, nullptr);
#endif
    HeapTuple tuple = heap_getnext(scan, ForwardScanDirection);
    bool is_null = true;
    Datum value = HeapTupleIsValid(tuple)
                      ? heap_getattr(tuple, 1, RelationGetDescr(relation), &is_null)
                      : static_cast<Datum>(0);
    if (!is_null) {
      bytea* bytes = DatumGetByteaPP(value);
      loaded.length = std::min<size_t>(VARSIZE_ANY_EXHDR(bytes), sizeof loaded.bytes);
      memcpy(loaded.bytes, VARDATA_ANY(bytes), loaded.length);
    }
    table_endscan(scan);
    table_close(relation, AccessShareLock);
  });
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

void unlock(const KeyIdentity& identity) {
  LOCKTAG tag = tag_of(identity);
  pg_call([&] { LockRelease(&tag, ExclusiveLock, false); });
}

}  // namespace idem::key_lock
