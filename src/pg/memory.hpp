// Memory contexts and the dynahash tables kept in them, as C++ allocates. Every wrapper
// catches (pg_call): out of memory comes back as PgError.
#pragma once

#include "../pg_boundary.hpp"

namespace idem::pg::memory {

// An uninitialised T in the current memory context. Raises (out of memory).
template <typename T>
T* allocate() {
  return pg_call([] { return static_cast<T*>(palloc(sizeof(T))); });
}
// A bytea of `Length` data bytes (its header not set) in the current memory context. Raises
// (out of memory). On the fingerprint's path: captures nothing, a constant size.
template <size_t Length>
inline bytea* allocate_bytea() {
  return pg_call([] { return static_cast<bytea*>(palloc(VARHDRSZ + Length)); });
}
// A memory context named `name` (a string constant: the context keeps the pointer) under
// `parent` (AllocSet, default sizes). Raises (out of memory). Allocates its header in `parent`.
inline MemoryContext new_context(MemoryContext parent, const char* name) {
  return pg_call(
      [&] { return AllocSetContextCreateInternal(parent, name, ALLOCSET_DEFAULT_SIZES); });
}
// Frees `pointer` (allocated by palloc). Raises (a corrupt chunk header). Allocates nothing.
inline void free(void* pointer) {
  pg_call([&] { pfree(pointer); });
}
// Empties `context` (keeps it). Raises not: a reset frees blocks and allocates nothing.
// pg-frame: a reset cannot raise; called without pg_call once per batch element.
inline void reset(MemoryContext context) {
  MemoryContextReset(context);  // pg: a reset does not raise
}
// A hash table of `entry_size`-byte entries keyed by their first `key_size` bytes (compared
// as bytes), made in `context` with room for `expected` entries. Raises (out of memory).
inline HTAB* new_blob_table(const char* name, long expected, size_t key_size, size_t entry_size,
                            MemoryContext context) {
  return pg_call([&] {
    HASHCTL control{};
    control.keysize = key_size;
    control.entrysize = entry_size;
    control.hcxt = context;
    return hash_create(name, expected, &control, HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
  });
}
// The entry of `key` in `table`, made (uninitialised, `*found` false) if there is none.
// Raises (out of memory). Allocates the entry in the table's context.
inline void* enter(HTAB* table, const void* key, bool* found) {
  return pg_call([&] { return hash_search(table, key, HASH_ENTER, found); });
}
// The entry of `key` in `table`, or nullptr. Raises not: a lookup allocates nothing.
// pg-frame: a lookup cannot raise; called without pg_call on the hot path.
inline void* find(HTAB* table, const void* key) {
  return hash_search(table, key, HASH_FIND, nullptr);  // pg: a lookup cannot raise
}

}  // namespace idem::pg::memory
