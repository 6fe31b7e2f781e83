// The lock manager, as C++ takes and lets go of locks. Every wrapper catches (pg_call).
#pragma once

#include "../pg_boundary.hpp"

namespace idem::pg::locks {

// Tries to take `tag` in `mode` at transaction level, never waiting. Raises when the lock
// table is out of shared memory. Allocates a local lock entry (LockMethodLocalHash).
inline LockAcquireResult try_acquire(const LOCKTAG& tag, LOCKMODE mode) {
  return pg_call([&] { return LockAcquire(&tag, mode, false, true); });
}
// Lets go of `tag` in `mode` (taken at transaction level). Raises not for a lock held;
// warns for one that is not. Frees the local lock entry.
inline void release(const LOCKTAG& tag, LOCKMODE mode) {
  pg_call([&] { LockRelease(&tag, mode, false); });
}

// Does a command want the current database to itself: DROP DATABASE, ALTER DATABASE RENAME
// or SET TABLESPACE, CREATE DATABASE copying it? Each holds (or waits for) the database's
// lock in a mode that conflicts with the RowExclusiveLock every connection takes to enter,
// then waits up to 5 s for the other connections to leave. Tried without waiting and let go at
// once, as a session lock (it runs between transactions). Raises when the lock table is out
// of shared memory; allocates a local lock entry and frees it.
inline bool database_wanted_alone() {
  LOCKTAG tag;
  SET_LOCKTAG_OBJECT(tag, InvalidOid, DatabaseRelationId, MyDatabaseId, 0);
  return pg_call([&] {
    if (LockAcquire(&tag, RowExclusiveLock, true, true) == LOCKACQUIRE_NOT_AVAIL) return true;
    LockRelease(&tag, RowExclusiveLock, true);
    return false;
  });
}

}  // namespace idem::pg::locks
