// Dynamic background workers and the shared memory segments that carry their work, as C++
// starts, watches and stops them. Every wrapper catches (pg_call).
#pragma once

#include "../pg_boundary.hpp"

namespace idem::pg::workers {

// Registers `worker`; false when no max_worker_processes slot is free. Raises (out of
// memory). Allocates `*handle` in the current memory context.
inline bool start(BackgroundWorker* worker, BackgroundWorkerHandle** handle) {
  return pg_call([&] { return RegisterDynamicBackgroundWorker(worker, handle); });
}
// The state of the worker of `handle`, its pid in `*pid` while it runs. Raises only for a
// handle that is not a worker's. Allocates nothing.
inline BgwHandleStatus status(BackgroundWorkerHandle* handle, pid_t* pid) {
  return pg_call([&] { return GetBackgroundWorkerPid(handle, pid); });
}
// Asks the worker of `handle` to stop (SIGTERM through the postmaster). Raises only for a
// handle that is not a worker's. Allocates nothing.
inline void stop(BackgroundWorkerHandle* handle) {
  pg_call([&] { TerminateBackgroundWorker(handle); });
}
// A new dynamic shared memory segment of `size` bytes, attached (until detach() or the end of
// the resource owner). Raises (too many segments, out of memory). Allocates its mapping
// record in TopMemoryContext.
inline dsm_segment* new_segment(Size size) {
  return pg_call([&] { return dsm_create(size, 0); });
}
// Detaches `segment` (the last detach destroys it). Raises (an unmap failure, rare). Frees
// its mapping record.
inline void detach(dsm_segment* segment) {
  pg_call([&] { dsm_detach(segment); });
}

}  // namespace idem::pg::workers
