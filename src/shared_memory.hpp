// One named struct in shared memory per concept (the stats, the key waits), reserved while
// shared_preload_libraries is processed: the space is requested, the struct is made once,
// and every process gets its address. The hooks chain to whatever was installed before.
#pragma once

#include "pg.hpp"

namespace idem::shared_memory {

template <typename T>
struct Region {
  static inline const char* name = nullptr;
  static inline T** where = nullptr;
  static inline void (*initialize)(T*) = nullptr;
  static inline shmem_request_hook_type previous_request = nullptr;
  static inline shmem_startup_hook_type previous_startup = nullptr;

  static void request() {
    if (previous_request) previous_request();
    RequestAddinShmemSpace(MAXALIGN(sizeof(T)));
  }

  static void attach() {
    if (previous_startup) previous_startup();
    LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
    bool found = false;
    T* region = static_cast<T*>(ShmemInitStruct(name, sizeof(T), &found));
    if (!found) initialize(region);  // the first process to attach makes it
    LWLockRelease(AddinShmemInitLock);
    *where = region;
  }
};

// Reserves a T named `name`; at start-up `*where` points at it in every process, and
// `initialize` has filled it in once. Call from _PG_init, under shared_preload_libraries.
template <typename T>
void reserve(const char* name, T** where, void (*initialize)(T*)) {
  Region<T>::name = name;
  Region<T>::where = where;
  Region<T>::initialize = initialize;
  Region<T>::previous_request = shmem_request_hook;
  shmem_request_hook = Region<T>::request;
  Region<T>::previous_startup = shmem_startup_hook;
  shmem_startup_hook = Region<T>::attach;
}

}  // namespace idem::shared_memory
