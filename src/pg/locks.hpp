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

}  // namespace idem::pg::locks
