// The route of a call to the key table: directly to its heap and indexes (key_heap), or
// through the executor (key_store's SPI statements). This is the one place that decides, once
// per SQL call: a Route is made when the call's key_store::Session is (its call-wide part) and
// completed when the call opens the table (the table's part); the Session carries it in its
// key_heap::OpenTable, and every function below asks it, none derives it again.
//
// Reads and writes go direct only when direct_path() says so (no Citus, no executor hook);
// a write then also needs a table whose shape the direct path can write (write_reason()).
// The isolation level does not change the route: under SERIALIZABLE and REPEATABLE READ the
// direct path carries the executor's duties itself (below).
//
// Duties the direct path carries because the executor would have (src/README.md has the
// table with the tests of each):
//   - privileges of the table work, read-only transactions, hot standby: open_writer
//     (pg_class_aclmask, PreventCommandIfReadOnly);
//   - predicate locks under SERIALIZABLE: the MVCC probe after the dirty look
//     (key_heap::find), and heapam / nbtree on writes;
//   - serialization failures under REPEATABLE READ: key_heap::look and probe_dirty raise 40001
//     for a version committed after the snapshot (raise_committed_after_snapshot);
//   - permission and object-access hooks (sepgsql, pgaudit): not carried: when one is set,
//     direct_path() is false and the executor makes every access;
//   - triggers, rules, policies, defaults, checks, generated columns: refused by the
//     installation check (42501) before any call; write_reason() sends them to the executor
//     should one appear anyway;
//   - interrupts: check_for_interrupts() per batch element; waits sleep interruptibly;
//   - replica identity, WAL, logical decoding, TOAST: heapam and nbtree
//     (CheckCmdReplicaIdentity on updates).
#pragma once

#include "pg.hpp"

namespace idem::route {

// Why a write must go through the executor: the one list of what INSERT and UPDATE do
// beyond forming the row and adding its index entries, which the direct path does not do.
// needs_executor() returns the first that applies; anything not listed here is what the
// direct path does itself (privilege and read-only checks, unique checks of the primary
// key, entries in every plain B-Tree index, replica identity, serialization conflicts).
enum class ExecutorReason {
  kNone,
  kRequested,          // idempotency.executor_path (a superuser's switch, for tests)
  kNotHeapTable,       // a partition, another table access method, or too many columns
  kUserColumn,         // a column we do not know: its default and constraints
  kTypmod,             // a typmod (say timestamptz(0)) is a coercion
  kExtraNotNull,       // NOT NULL added to a column that may be NULL
  kDefault,            // a default on a column the claim's INSERT leaves out
  kIdentityGenerated,  // an identity or generated column
  kIndexKind,          // more indexes than kept, or one not a plain, immediate B-Tree or BRIN
  kOtherUniqueIndex,   // a unique index besides the primary key (an arbiter, or a 23505)
  kTrigger,
  kRule,
  kRowSecurity,
  kCheckConstraint,
};

// What the direct path needs to know about the table, loaded once per backend and
// forgotten by the relcache callback whenever the table or one of its indexes changes

// May this call read and write the table directly at all? Not under Citus (its planner
// routes each statement to the shard holding the key: the local table is an empty shell),
// and not when a hook that the executor calls for every statement is set
// (ExecutorCheckPerms_hook: sepgsql, pgaudit's object audit; object_access_hook): those must
// see every access, so the executor makes them all.
bool direct_path();

// Why a write to `table` (open and locked) must go through the executor: the first reason
// that applies, from the table's cached layout, its relcache entry, and the superuser switch
// idempotency.executor_path; kNone when the direct path may write.
ExecutorReason write_reason(Relation table);

// The route of one SQL call (see the top of this file).
class Route {
 public:
  // The call-wide part: direct_path(), the superuser switch idempotency.executor_path, and
  // whether the call runs with an active snapshot (the direct reads judge versions by it).
  static Route of_call();
  // The table's part, once the call has opened and locked the table (its relcache entry and
  // layout are current then, and stay so while the lock is held): write_reason(table).
  void table_opened(Relation table);

  // A claim's look (Session::peek) probes the primary key itself.
  bool direct_reads() const { return direct_ && snapshot_; }
  // look_key / forget_key's look probes it itself: also not when the superuser asked for the
  // executor path, so that the tests of that path cover what Citus and the hooks use.
  bool direct_looks() const { return direct_reads() && !requested_; }
  // A write may be tried directly (the table is then opened, and may still refuse).
  bool may_write_directly() const { return direct_; }
  // The opened table can be written directly (table_opened() was called).
  bool direct_writes() const { return direct_ && reason_ == ExecutorReason::kNone; }

 private:
  bool direct_ = false;                                 // direct_path()
  bool requested_ = false;                              // idempotency.executor_path
  bool snapshot_ = false;                               // ActiveSnapshotSet()
  ExecutorReason reason_ = ExecutorReason::kRequested;  // until table_opened()
};

}  // namespace idem::route
