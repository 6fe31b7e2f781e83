// The hot path to idempotency_keys: its heap and indexes reached directly, without the
// executor.
//
// A profile of a new-key claim showed the executor's INSERT ... ON CONFLICT costing half of
// the whole transaction (executor start-up, the speculative insertion's conflict pre-check,
// its confirmation record), and an UPDATE as much again for the completion in the same
// transaction. The common cases therefore skip it:
//   - the first look at a key is one primary-key probe with a dirty snapshot (committed or
//     in-progress versions): it finds either nothing, or the version the statement's
//     snapshot sees, or (rarely) something only a second look can decide;
//   - a new key is inserted as one heap tuple plus its index entries, speculatively: the
//     primary key is the arbiter, and no per-key lock is taken (docs/design-batch.md);
//   - the completion of a claim made by the same transaction updates the row it inserted,
//     found by its TID, in place (a HOT update when the page has room).
// Everything else (re-claims, the two-phase pattern, release, checkpoint) and every table
// whose definition needs the executor's machinery (triggers, row-level security, CHECK
// constraints, expression or partial indexes, extra columns, Citus) goes through the
// executor (key_store). route.hpp decides which, and lists the executor's duties that the
// direct path carries itself. The files: key_layout.cpp (what the table looks like),
// key_heap.cpp (reads), key_heap_write.cpp (writes).
#pragma once

#include "key_layout.hpp"
#include "key_row.hpp"
#include "pg/errors.hpp"

namespace idem::key_heap {

// Locks and pins, for every function below: the table and the indexes it opens are locked
// in RowExclusiveLock (the mode of an INSERT) and stay locked to the transaction's end, as
// the executor's would; buffer pins are taken and dropped within the call; no row lock and
// no lock-manager entry per key is left behind.

// The table and its indexes, opened once for a whole SQL call (every element of a batch,
// the look and the insert of one claim): each is opened in RowExclusiveLock on first use and
// closed by close() when the call ends. An error leaves them to the transaction's abort,
// which closes relations and releases locks. Opening per step cost about 2,000 instructions
// a step (a local lock-table probe and a relcache lookup each), a tenth of a replay.
// It also carries the call's route (route.hpp), completed when the table is first opened.
class OpenTable {
 public:
  OpenTable(Oid table, const route::Route& route) : oid_(table), route_(route) {}
  // Closes nothing: close() does at the call's end, transaction abort after an error.
  ~OpenTable() = default;
  OpenTable(const OpenTable&) = delete;
  OpenTable& operator=(const OpenTable&) = delete;
  OpenTable(OpenTable&&) = delete;
  OpenTable& operator=(OpenTable&&) = delete;

  Oid oid() const { return oid_; }
  // The call's route; its table part is known once table() has been called.
  const route::Route& route() const { return route_; }
  // The table, its layout checked (key_layout::of: refuses a table this version cannot use).
  // Its first opening in the call completes the route.
  Relation table();
  // The primary key (opened with the table's other indexes left closed).
  Relation primary_key();
  // Every index of the layout, in its order (key_layout::Layout::index_oids), for a write.
  void open_indexes();
  int index_count() const { return index_count_; }
  Relation index(int i) const { return indexes_[i]; }
  // The direct write with `privileges` is allowed: the owner (whom the table work runs as)
  // holds them. Asked once per call and privilege set.
  bool owner_may(AclMode privileges);
  // Closes what is open (the normal end of the call).
  void close();

 private:
  int primary_key_position();

  Oid oid_;
  route::Route route_;
  Relation table_ = nullptr;
  int index_count_ = 0;  // indexes_[0 .. index_count_) follow the layout's order
  Relation indexes_[key_layout::kMaxIndexes] = {};
  Relation primary_key_ = nullptr;  // one of indexes_, or opened alone for a read
  bool primary_key_alone_ = false;
  AclMode granted_ = 0;
  AclMode refused_ = 0;
};

using key_store::ClaimValues;
using key_store::KeyRow;
using key_store::Outcome;
using pg::errors::raise_committed_after_snapshot;

// The row of (owner, scope, key) that this transaction sees with `read` (Read::kStatement
// or Read::kLatest). Under SERIALIZABLE the probe takes the predicate locks a SELECT would.
// Varlena values are copied into `context`. Snapshot: `read`, an MVCC one; no write.
std::optional<KeyRow> find(OpenTable& table, text* owner, text* scope, text* key,
                           MemoryContext context, Read read);

// What the first look at a key found.
enum class Seen {
  kNothing,    // no version of the key is live for anyone: insert() need not probe again
  kRow,        // `*row` is the version the statement's snapshot sees
  kUndecided,  // a version of an open transaction, or (READ COMMITTED) one committed after
               // the statement's snapshot: find(Read::kLatest) decides
};
// The first look at (owner, scope, key): one primary-key descent with a dirty snapshot,
// which answers both "is there any version?" (for the insert that may follow) and, in the
// common case, "which row does the statement see?" (for the verdict). Varlena values of
// `*row` are copied into `context`. Under REPEATABLE READ and SERIALIZABLE a version committed
// after the transaction's snapshot raises 40001, as INSERT .. ON CONFLICT does: no answer is
// given from a version the transaction cannot see the end of. The dirty probe takes no
// predicate lock: under SERIALIZABLE the caller reads again with find() for them.
// Snapshot: Read::kDirty, judged against Read::kStatement; no write.
Seen look(OpenTable& table, text* owner, text* scope, text* key, MemoryContext context,
          std::optional<KeyRow>* row);

// Does another transaction that is still open write (owner, scope, key): a version it inserted
// (a claim in flight), or one it updates or deletes? One primary-key probe with a dirty
// snapshot; no lock, no wait, no predicate lock (look_key decides nothing from it but
// "in_progress"). A row locked by FOR UPDATE alone is not seen: in this table that lock is
// taken only by a statement that updates or deletes the row in the same call.
// Snapshot: Read::kDirty; no write.
bool written_by_open_transaction(OpenTable& table, text* owner, text* scope, text* key);

// kBusy: another transaction that is still open inserted (claimed) the key.
enum class InsertResult { kInserted, kExists, kBusy, kNeedsExecutor };

// Inserts a fresh claim of (claim.owner, scope, key) unless a version of it exists that a
// dirty snapshot sees, without any per-key lock and without ever waiting: the primary key
// arbitrates (a speculative insertion, taken back when another version won the race).
// kExists: a committed version (or this transaction's own, or one being deleted); decide
// again from it. `where` receives the new row's address. `known_absent`: look() found
// nothing just now, so the probe before the insertion is skipped (a version inserted since
// by another transaction still loses or wins at the primary key). Snapshot: Read::kDirty for
// the probes; the speculative-insertion lock is held only between the heap insert and its
// confirmation or super-delete. Under SERIALIZABLE heapam and nbtree check for conflicts
// with other transactions' predicate locks (CheckForSerializableConflictIn) as for any insert.
InsertResult insert(OpenTable& table, text* scope, text* key, const ClaimValues& claim,
                    key_store::RowAddress* where, bool known_absent);

// Completes the claim `token` of (scope, key) that this transaction inserted at `where`.
// nullopt means "not done here": the table needs the executor, or the row at `where` is no
// longer that claim's live row; the executor path then decides (and explains a refusal).
// Snapshot: Read::kSelf on the row at `where` (this transaction's newest version); a HOT
// update when the page has room, new index entries otherwise.
std::optional<KeyRow> complete(OpenTable& table, const key_store::RowAddress& where, text* scope,
                               text* key, const pg_uuid_t& token, const key_store::Owner& owner,
                               const Outcome& outcome, TimestampTz now, TimestampTz expires_at,
                               MemoryContext context);

}  // namespace idem::key_heap
