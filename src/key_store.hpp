// The idempotency_keys table, reached through the executor (SPI) with plans prepared once
// per backend, or, on the hot path and where the table allows it, directly (key_heap.hpp).
// Going through the executor is what lets Citus route each statement to the shard that
// holds the key. Every value is computed in C++ and passed as a parameter: no statement
// calls a volatile function.
#pragma once

#include "caller.hpp"
#include "key_heap.hpp"
#include "key_lock.hpp"
#include "key_row.hpp"

namespace idem::key_store {

// One SPI connection for the duration of an SQL call, on the installation's table (found and
// checked by caller::of_function, never through search_path). Keys are (owner, scope, key),
// the owner being the claiming role's name (so a key names its role wherever its row moves).
class Session {
 public:
  // `acting` pins its search_path before the first statement this session runs.
  Session(Oid table, caller::ActingAsOwner& acting);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  Session(Session&&) = delete;
  Session& operator=(Session&&) = delete;

  // Where varlena values of the rows read are copied from now on (a batch empties a
  // context per element).
  void use_context(MemoryContext context) { caller_context_ = context; }

  // Closes the SPI connection and the relations the direct path opened; the destructor
  // leaves an unfinished session to transaction abort, which is the only way it is left
  // unfinished.
  void finish();

  // A look at a key before deciding: the row this transaction sees, read by a direct primary
  // key probe where the call's route reads directly (Read::kDirty, then Read::kLatest or
  // Read::kStatement as key_heap::look leaves it), else by SPI with `read`: Read::kStatement
  // for a first look, Read::kLatest after waiting (to see the holder's end). `*absent` is set
  // when no version of the key is live for anyone, so that insert_unlocked() need not look
  // again. Raises 40001 under REPEATABLE READ and SERIALIZABLE where a version committed after
  // the snapshot would decide (key_heap::look).
  std::optional<KeyRow> peek(text* owner, text* scope, text* key, bool* absent, Read read);
  // Plain MVCC read through SPI: no row lock, no write. `read`: Read::kStatement (cheaper;
  // right for a first look), Read::kLatest (sees commits while waiting, and a claim made
  // earlier in this transaction), or Read::kNow (tells a snapshot transaction on the executor
  // path that a version it cannot see exists).
  std::optional<KeyRow> find(text* owner, text* scope, text* key, Read read);
  // Locks the newest version of the row, skipping it if another transaction has it locked.
  std::optional<KeyRow> lock(text* owner, text* scope, text* key);
  // A look that decides nothing and changes nothing (look_key, forget_key): the row as of now
  // (Read::kLatest: at READ COMMITTED a new snapshot; a snapshot transaction: its own, as a
  // SELECT reads), and
  // whether another transaction that is still open writes the key (inserted it, or updates,
  // deletes or has locked its row). It never waits and leaves no lock behind. The direct path
  // tells that from a dirty primary-key probe (Read::kDirty); the executor path from the row's
  // xmax and,
  // where no row is visible, from the key lock that the executor path's claims take (tried
  // without waiting and let go at once: `identity`).
  struct Look {
    std::optional<KeyRow> row;
    bool held_by_open_transaction = false;
  };
  Look look(text* owner, text* scope, text* key, const key_lock::KeyIdentity& identity);
  // Deletes the row of (owner, scope, key), which the caller has locked (lock()); false when
  // there was none to delete.
  bool remove(text* owner, text* scope, text* key);
  // Inserts a fresh claim without any per-key lock, where the table can be written
  // directly (key_heap::insert): kInserted, kExists (a version to decide from), kBusy (a
  // claim of another open transaction). kNeedsLock: only the executor can write here, and
  // the caller must hold the key lock and call insert() (INSERT .. ON CONFLICT would wait on
  // an open inserter otherwise). `where` receives the new row's address.
  enum class Insert { kInserted, kExists, kBusy, kNeedsLock };
  Insert insert_unlocked(text* scope, text* key, const ClaimValues& claim, RowAddress* where,
                         bool known_absent);
  // Inserts a fresh claim through the executor; false when the key exists. The caller holds
  // the key lock. `where` receives kNowhere.
  bool insert(text* scope, text* key, const ClaimValues& claim, RowAddress* where);
  // Replaces an expired row by a fresh claim (attempts 1, no recovery point).
  void restart(text* scope, text* key, const ClaimValues& claim);
  // Takes over a processing row whose lease ended or was released; returns the new row.
  KeyRow reclaim(text* scope, text* key, const ClaimValues& claim);
  // Fenced completion; nullopt when `token` does not hold a live processing row of `owner`
  // (its name, and a stamp that belongs_to() accepts; the row is stamped with the caller's).
  // `where` is the address insert() reported if this transaction made the claim, else
  // kNowhere.
  std::optional<KeyRow> complete(text* scope, text* key, const pg_uuid_t& token, const Owner& owner,
                                 const Outcome& outcome, TimestampTz now, TimestampTz expires_at,
                                 const RowAddress& where);
  // Fenced release; false when `token` does not hold the key.
  bool release(text* scope, text* key, const pg_uuid_t& token, const Owner& owner, TimestampTz now);
  // Fenced checkpoint; false when `token` does not hold the key.
  bool checkpoint(text* scope, text* key, const pg_uuid_t& token, const Owner& owner,
                  text* recovery_point, TimestampTz now, TimestampTz locked_until);

 private:
  // Opens the SPI connection (and prepares the plans) on first use: a replay answered by
  // peek() never connects.
  void connect();
  uint64 execute(int plan, Datum* values, const char* nulls, bool read_only, long limit);
  // find() with Read::kNow: the key ($1 scope, $2 key, $3 owner) read with the latest snapshot.
  std::optional<KeyRow> find_as_of_now(Datum* values);
  // Runs one of the claim statements (insert, restart, reclaim) with a claim's values.
  uint64 execute_claim(int plan, text* scope, text* key, const ClaimValues& claim);

  MemoryContext caller_context_;
  key_heap::OpenTable open_table_;  // the table (its OID), and the direct path's relations
  caller::ActingAsOwner& acting_;
  bool connected_ = false;
  bool finished_ = false;
};

}  // namespace idem::key_store

namespace idem::key_store {

// Registers the syscache callback that makes the kept plans stale when enum labels change.
void on_load();
// "schema"."idempotency_keys", quoted for SQL text.
std::string qualified_name(Oid table);

}  // namespace idem::key_store
