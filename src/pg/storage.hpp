// The direct path's storage calls (key_layout.cpp, key_heap.cpp, key_heap_write.cpp): the
// opening and closing of the key table and its indexes, and the steps that run whole inside
// one pg_call, each a pg-frame function of its file (listed in test/lint/boundary.py's
// PG_FRAMES): the reading of the table's layout, the read of a key, the speculative insertion
// of a claim, the update of a completion. Every wrapper catches (pg_call). Most are on the
// claim path: each is inline over the always_inline pg_call, so that a wrapper costs what the
// pg_call it replaced cost (bench/run.sh instructions).
#pragma once

#include "../key_heap_scan.hpp"
#include "../key_layout.hpp"
#include "../pg_boundary.hpp"

namespace idem::pg::storage {

// key_layout::read_into_cache(table) under pg_call: the table's columns, labels and indexes
// read into the layout cache (what it finds unusable comes back as a LayoutCheck). Raises (a
// catalog or relcache read failure, out of memory). Allocates the index information in the
// layout's own memory context, under TopMemoryContext; takes AccessShareLock on each index.
inline key_layout::LayoutCheck read_layout(Relation table) {
  return pg_call([&] { return key_layout::read_into_cache(table); });
}

// The table `table`, opened and locked in `mode` (held to the transaction's end). Raises
// (42P01 for a table dropped meanwhile, a lock wait cancelled). Allocates a relcache
// reference (the transaction's resource owner).
inline Relation open_table(Oid table, LOCKMODE mode) {
  return pg_call([&] { return table_open(table, mode); });
}
// The index `index`, opened and locked in `mode`. Raises as open_table. Allocates a relcache
// reference.
inline Relation open_index(Oid index, LOCKMODE mode) {
  return pg_call([&] { return index_open(index, mode); });
}
// Closes `index`, its lock kept to the transaction's end. Raises not (a relcache reference
// released). Allocates nothing.
inline void close_index(Relation index) {
  pg_call([&] { index_close(index, NoLock); });
}
// Opens the indexes oids[*opened .. count) into `into` in `mode`, counting each in `*opened`
// once it is open (so that what was opened before an error is still closed); when `reopen`,
// first closes the `*opened` open ones (locks kept) and starts from 0. Raises as open_table.
// Allocates relcache references.
inline void open_indexes(const Oid* oids, int count, LOCKMODE mode, bool reopen, Relation* into,
                         int* opened) {
  pg_call([&] {
    if (reopen) {
      for (int i = 0; i < *opened; ++i) index_close(into[i], NoLock);
      *opened = 0;
    }
    for (; *opened < count; ++*opened) into[*opened] = index_open(oids[*opened], mode);
  });
}
// Closes `count` indexes, then `alone` and `table` where not nullptr, their locks kept to the
// transaction's end. Raises not. Allocates nothing.
inline void close_relations(Relation* indexes, int count, Relation alone, Relation table) {
  pg_call([&] {
    for (int i = 0; i < count; ++i) index_close(indexes[i], NoLock);
    if (alone != nullptr) index_close(alone, NoLock);
    if (table != nullptr) table_close(table, NoLock);
  });
}
// Which of `privileges` the current user holds on the table `table`. Raises (42P01 for a table
// dropped meanwhile, a syscache failure). Allocates nothing that outlives the call.
inline AclMode user_privileges(Oid table, AclMode privileges) {
  return pg_call([&] { return pg_class_aclmask(table, GetUserId(), privileges, ACLMASK_ALL); });
}
// Refuses `command` (a write: "INSERT", "UPDATE") in a read-only transaction (25006) or in
// parallel mode (25000), as the executor would. Allocates nothing.
inline void check_writable(const char* command) {
  pg_call([&] {
    PreventCommandIfReadOnly(command);
    PreventCommandIfParallelMode(command);
  });
}
// Makes this command's writes visible to the next ones (CommandCounterIncrement). Raises (too
// many commands in the transaction, a callback's error). Allocates nothing that outlives it.
inline void make_writes_visible() {
  pg_call([] { CommandCounterIncrement(); });
}
// Drops `slot` (made by read_key) and its pin. Raises not in practice (a pin released).
// Frees the slot.
inline void drop_slot(TupleTableSlot* slot) {
  pg_call([&] { ExecDropSingleTupleTableSlot(slot); });
}

// key_heap::read_step under pg_call: one primary-key probe of (owner, scope, key) and the
// decision `purpose` asks for, the slot left in `*slot` (drop it with drop_slot). Raises
// (40001 under ReadFor::kLook for a version committed after the snapshot, an I/O error, out
// of memory). Allocates the slot in the current memory context; pins a buffer until the
// slot is dropped.
inline key_heap::ReadOutcome read_key(key_heap::ReadFor purpose, Relation table,
                                      Relation primary_key, Read read, SnapshotData* dirty,
                                      text* owner, text* scope, text* key, TupleTableSlot** slot) {
  return pg_call([&] {
    return key_heap::read_step(purpose, table, primary_key, read, dirty, owner, scope, key, slot);
  });
}
// key_heap::insert_step under pg_call: the speculative insertion of a fresh claim. Raises
// (40001 for a version committed after the snapshot, a unique violation of another index, an
// I/O error, out of memory). Allocates the heap tuple in the current memory context (freed);
// the speculative-insertion lock is released within.
inline key_heap::InsertResult insert_claim(key_heap::OpenTable& open, Relation table,
                                           Relation primary_key, text* scope, text* key,
                                           const key_store::ClaimValues& claim,
                                           key_store::RowAddress* where, bool known_absent) {
  return pg_call([&] {
    return key_heap::insert_step(open, table, primary_key, scope, key, claim, where, known_absent);
  });
}
// key_heap::update_step under pg_call: the heap update of a completion. Raises (a table
// without replica identity for UPDATE under a publication, an I/O error, out of memory).
// Allocates the new tuple in the current memory context (kept: `values` point into it).
inline bool update_claimed_row(Relation table, const key_store::RowAddress& where, text* scope,
                               text* key, const pg_uuid_t& token, const key_store::Owner& owner,
                               const key_store::Outcome& outcome, TimestampTz now,
                               TimestampTz expires_at, Datum* values, bool* nulls, HeapTuple* tuple,
                               uint64* changed, key_heap::Indexes* new_entries, bool* any_entries) {
  return pg_call([&] {
    return key_heap::update_step(table, where, scope, key, token, owner, outcome, now, expires_at,
                                 values, nulls, tuple, changed, new_entries, any_entries);
  });
}
// key_heap::insert_index_entries under pg_call, for an updated row: the entries of `indexes`
// for the tuple at `tid`. Raises (a unique violation, an I/O error, out of memory). Allocates
// in the current memory context; a BRIN insert state in key_layout's insert_states_context().
inline void add_index_entries(Relation table, const key_heap::OpenTable& open, Datum* values,
                              bool* nulls, ItemPointer tid, uint64 changed,
                              key_heap::Indexes indexes) {
  pg_call(
      [&] { key_heap::insert_index_entries(table, open, values, nulls, tid, changed, indexes); });
}

}  // namespace idem::pg::storage
