// The claim protocol (SPEC §3): one call decides, inside the caller's transaction, whether
// this request does the work (claimed / reclaimed) or answers from the stored state
// (replay / mismatch / in_progress).
//
// How a claim stays correct under any concurrency:
//   1. Read the row the statement's snapshot sees (on the direct path, one primary-key probe
//      with a dirty snapshot that also tells whether any version exists at all). A
//      completed, mismatched or leased row is answered from there: a replay takes no lock
//      and writes nothing.
//   2. No row: insert it with the primary key as the arbiter (key_heap::insert: a
//      speculative insertion that never waits). A version inserted by a
//      transaction still open means a claim in flight: in_progress. No lock-manager entry
//      is kept per key, so one transaction can claim any number of keys. Where only the
//      executor can write (Citus, triggers, ...: key_heap.cpp's ExecutorReason), the
//      per-key transaction lock (key_lock.hpp) is taken first instead, as INSERT .. ON
//      CONFLICT would wait on an open inserter.
//   3. A row to take over (expired, lease ended, released) is locked with FOR UPDATE SKIP
//      LOCKED and updated: a transaction holding it is skipped, never waited for.
// Waiting (wait > 0) repeats the steps after sleeping until a transaction that wrote the key
// ends (a condition variable in shared memory, key_wait.hpp; latch sleeps that back off
// without preloading), so a waiter sees the holder's commit or rollback at once, answers
// interrupts, and never spins.
#include "claim_protocol.hpp"

#include "key_lock.hpp"
#include "key_wait.hpp"
#include "responses.hpp"
#include "stats.hpp"
#include "uuid_v7.hpp"
#include "pg/errors.hpp"

namespace idem::claim_protocol {
namespace {

using arguments::add_interval;
using claim_result::Status;
using claim_result::stored_answer;

ClaimResult in_progress(int64 retry_after_us) {
  ClaimResult result(Status::kInProgress);
  result.retry_after_us = std::max<int64>(retry_after_us, 1000);
  stats::count(stats::kInProgress);
  return result;
}

enum class Verdict { kAbsent, kExpired, kMismatch, kReplay, kLeased, kReclaimable };

// The SPEC's status table, applied to a row of the caller's (owner, scope, key) as read at
// `now`. Another role's row of the same (scope, key) is another key: never read here. A row of
// an earlier role of the caller's name (stamped here with another OID) is as good as expired:
// nothing of it answers, and a claim replaces it with a fresh one.
Verdict judge(const std::optional<KeyRow>& row, const bytea* fingerprint, const Caller& caller,
              TimestampTz now) {
  if (!row) return Verdict::kAbsent;
  if (row->expires_at <= now || !key_store::belongs_to(*row, caller.role, caller.system))
    return Verdict::kExpired;
  if (fingerprint != nullptr && row->fingerprint != nullptr &&
      !key_store::same_bytes(fingerprint, row->fingerprint))
    return Verdict::kMismatch;
  if (row->completed) return Verdict::kReplay;
  if (row->lease_token && row->locked_until && *row->locked_until > now) return Verdict::kLeased;
  return Verdict::kReclaimable;
}

key_store::ClaimValues claim_values(const ClaimRequest& request, TimestampTz now) {
  key_store::ClaimValues values{};
  values.owner = request.caller.name;
  values.owner_oid = request.caller.role;
  values.owner_system = request.caller.system;
  values.fingerprint = request.fingerprint;
  values.token = *uuid_v7::generate();
  values.now = now;
  values.ttl = request.ttl;
  values.lease = request.lease;
  values.locked_until = add_interval(now, request.lease);
  // A processing key never expires while its lease runs.
  values.expires_at = std::max(add_interval(now, request.ttl), values.locked_until);
  return values;
}

ClaimResult claimed_answer(Status status, const key_store::ClaimValues& values,
                           const key_store::RowAddress& where, int32 attempts, text* recovery_point,
                           TimestampTz created_at, bytea* fingerprint, uint32 wait_slot) {
  own_claims::remember(values.token, values.ttl, where);
  key_wait::touched(wait_slot);
  stats::count(status == Status::kClaimed ? stats::kClaimed : stats::kReclaimed);
  ClaimResult result(status);
  result.token = values.token;
  result.fingerprint = fingerprint;
  result.recovery_point = recovery_point;
  result.attempts = attempts;
  result.created_at = created_at;
  result.expires_at = values.expires_at;
  return result;
}

// What one attempt at writing the key decided: an answer, or to look again, at once (the row
// changed or went since the look) or after waiting (`busy`: a transaction still open holds
// the key).
struct Attempt {
  std::optional<ClaimResult> answer;
  bool busy = false;
};

Attempt answered(const ClaimResult& result) {
  return {result, false};
}
Attempt look_again() {
  return {};
}
Attempt busy() {
  return {std::nullopt, true};
}

// Only the executor can write this table: its INSERT .. ON CONFLICT would wait on an open
// inserter, so the key lock tells an open claim apart first. A new claim keeps the lock
// until its transaction ends; otherwise a lock taken here is let go.
Session::Insert insert_under_key_lock(Session& store, const ClaimRequest& request,
                                      const key_store::ClaimValues& values,
                                      key_store::RowAddress* where) {
  const KeyName& name = request.name;
  const key_lock::KeyIdentity identity = name.identity(request.table, request.caller.role);
  const key_lock::Outcome lock = key_lock::try_lock(identity);
  if (lock == key_lock::Outcome::kBusy) return Session::Insert::kBusy;
  if (store.insert(name.scope, name.key, values, where)) return Session::Insert::kInserted;
  if (lock == key_lock::Outcome::kAcquired) key_lock::unlock(identity);
  return Session::Insert::kExists;
}

// No row of the key: insert a fresh claim, the primary key arbitrating (key_heap::insert).
// `known_absent`: the look found no version at all, so the insert need not probe again.
Attempt insert_new_key(Session& store, const ClaimRequest& request, TimestampTz now,
                       bool known_absent) {
  const KeyName& name = request.name;
  const key_store::ClaimValues values = claim_values(request, now);
  key_store::RowAddress where{};
  Session::Insert inserted =
      store.insert_unlocked(name.scope, name.key, values, &where, known_absent);
  if (inserted == Session::Insert::kNeedsLock)
    inserted = insert_under_key_lock(store, request, values, &where);
  switch (inserted) {
    case Session::Insert::kInserted:
      return answered(claimed_answer(Status::kClaimed, values, where, 1, nullptr, now,
                                     request.fingerprint, name.wait_slot(request.caller.role)));
    case Session::Insert::kBusy:
      return busy();
    case Session::Insert::kExists:
    case Session::Insert::kNeedsLock:
      break;
  }
  return look_again();  // a claim committed between the look and the insert
}

// A row to take over (expired, lease ended, released), under its row lock (FOR UPDATE SKIP
// LOCKED): a transaction that holds it makes us skip it, never wait, and no per-key lock is
// needed.
Attempt take_over(Session& store, const ClaimRequest& request, TimestampTz now) {
  const KeyName& name = request.name;
  const std::optional<KeyRow> locked = store.lock(request.caller.name, name.scope, name.key);
  // Gone (the cleanup), or locked by another transaction (a cleanup batch, the old holder
  // finishing): look again, and wait if it persists.
  if (!locked) return look_again();
  switch (judge(locked, request.fingerprint, request.caller, now)) {
    case Verdict::kExpired: {
      const key_store::ClaimValues values = claim_values(request, now);
      store.restart(name.scope, name.key, values);
      return answered(claimed_answer(Status::kClaimed, values, key_store::kNowhere, 1, nullptr, now,
                                     request.fingerprint, name.wait_slot(request.caller.role)));
    }
    case Verdict::kReclaimable: {
      const key_store::ClaimValues values = claim_values(request, now);
      const KeyRow renewed = store.reclaim(name.scope, name.key, values);
      return answered(claimed_answer(Status::kReclaimed, values, key_store::kNowhere,
                                     renewed.attempts, renewed.recovery_point, renewed.created_at,
                                     renewed.fingerprint, name.wait_slot(request.caller.role)));
    }
    default:
      return look_again();  // the row changed since the look
  }
}

[[noreturn]] void reject_missing(const KeyName& name) {
  throw Error(ERRCODE_NO_DATA_FOUND,
              "idempotency key " + name.describe() + " does not exist or has expired");
}

bool same_token(const std::optional<pg_uuid_t>& stored, const pg_uuid_t& token) {
  return stored && memcmp(stored->data, token.data, UUID_LEN) == 0;
}

// Explains why a fenced statement matched no row, by throwing; returns the row only when
// the key was completed with this very token (the caller decides whether that is a no-op).
// A row of an earlier role of the caller's name is missing for the caller.
bool live_for(const std::optional<KeyRow>& row, const Caller& caller, TimestampTz now) {
  return row && row->expires_at > now && key_store::belongs_to(*row, caller.role, caller.system);
}

key_store::Owner owner_of(const Caller& caller) {
  return {caller.name, caller.role, caller.system};
}

KeyRow explain_fence(Session& store, const KeyName& name, const pg_uuid_t& token,
                     const Caller& caller, TimestampTz now) {
  std::optional<KeyRow> row = store.find(caller.name, name.scope, name.key, Read::kLatest);
  if (!live_for(row, caller, now)) reject_missing(name);
  if (row->completed && same_token(row->lease_token, token)) return *row;
  if (row->completed)
    throw Error(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                "idempotency key " + name.describe() + " was completed by another claim");
  if (!row->lease_token)
    throw Error(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                "idempotency key " + name.describe() + " was released",
                "A released claim cannot be completed; claim the key again.");
  // Tokens are UUIDv7s made at claim time: one from between the key's creation and the
  // current holder's claim may be an earlier holder's; any other was never this key's.
  const std::optional<TimestampTz> issued = uuid_v7::time_of(&token);
  const std::optional<TimestampTz> current = uuid_v7::time_of(&*row->lease_token);
  const bool earlier_holder = issued && current && *issued >= row->created_at - 1000 &&
                              *issued <= *current && row->attempts > 1;
  throw Error(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
              "token does not hold idempotency key " + name.describe(),
              earlier_holder ? "The key is held by attempt " + std::to_string(row->attempts) +
                                   "; this token's lease ended and the key was claimed again."
                             : "This token was never issued for this key; the key is held by "
                               "attempt " +
                                   std::to_string(row->attempts) + ".",
              earlier_holder ? "" : "Pass the token that claim_key returned for this key.");
}

}  // namespace

// Look, then insert a new key or take an old one over; wait (wait > 0) until a transaction
// that wrote the key ends (key_wait.hpp) when it is held.
ClaimResult claim(Session& store, const ClaimRequest& request) {
  const KeyName& name = request.name;
  int retries_without_sleep = 0;
  // The key's slot is hashed only for a claim that may wait: a replay or a batch element
  // never sleeps, and pays no hash.
  const bool may_wait = request.deadline > GetCurrentTimestamp();
  key_wait::Waiter waiter(may_wait ? name.wait_slot(request.caller.role) : 0, may_wait);
  for (bool first_look = true;; first_look = false) {
    waiter.prepare();  // before looking: a holder that ends after the look wakes us
    const TimestampTz now = GetCurrentTimestamp();
    bool known_absent = false;
    // Every look is the dirty-snapshot look where the direct path may read: after waiting it
    // sees the holder's end, and a snapshot transaction gets 40001 instead of a stale row.
    const std::optional<KeyRow> row =
        store.peek(request.caller.name, name.scope, name.key, &known_absent,
                   first_look ? Read::kStatement : Read::kLatest);
    Attempt attempt;
    switch (judge(row, request.fingerprint, request.caller, now)) {
      case Verdict::kMismatch:
        stats::count(stats::kMismatched);
        return stored_answer(Status::kMismatch, *row, now);
      case Verdict::kReplay:
        stats::count(stats::kReplayed);
        return stored_answer(Status::kReplay, *row, now);
      case Verdict::kLeased:
        if (now >= request.deadline) return in_progress(*row->locked_until - now);
        waiter.sleep(request.deadline);
        continue;
      case Verdict::kAbsent:
        attempt = insert_new_key(store, request, now, known_absent);
        break;
      case Verdict::kExpired:
      case Verdict::kReclaimable:
        attempt = take_over(store, request, now);
        break;
    }
    if (attempt.answer) return *attempt.answer;
    // Busy: a claim of this key is in a transaction that is still open. Else the key changed
    // under us: look again at once, twice, then wait as for a holder.
    if (attempt.busy || ++retries_without_sleep > 2) {
      if (now >= request.deadline) return in_progress(USECS_PER_SEC);
      waiter.sleep(request.deadline);
    }
  }
}

ClaimResult look(Session& store, const KeyName& name, const bytea* fingerprint,
                 const Caller& caller, Oid table, TimestampTz now) {
  const key_store::Session::Look seen =
      store.look(caller.name, name.scope, name.key, name.identity(table, caller.role));
  const Verdict verdict = judge(seen.row, fingerprint, caller, now);
  // A claim would write the key, and another open transaction writes it: a claim would wait,
  // or answer in_progress (the holder's lease is not visible yet: a second, as claim() says).
  if (seen.held_by_open_transaction &&
      (verdict == Verdict::kAbsent || verdict == Verdict::kExpired ||
       verdict == Verdict::kReclaimable)) {
    ClaimResult result(Status::kInProgress);
    result.retry_after_us = USECS_PER_SEC;
    return result;
  }
  switch (verdict) {
    case Verdict::kAbsent:
    case Verdict::kExpired:
      return ClaimResult(Status::kClaimed);  // nothing of a row the claim would replace
    case Verdict::kMismatch:
      return stored_answer(Status::kMismatch, *seen.row, now);
    case Verdict::kReplay:
      return stored_answer(Status::kReplay, *seen.row, now);
    case Verdict::kLeased: {
      // The caller's own key: what it was claimed with, and when the lease ends.
      ClaimResult result = stored_answer(Status::kInProgress, *seen.row, now);
      result.retry_after_us = std::max<int64>(*seen.row->locked_until - now, 1000);
      return result;
    }
    case Verdict::kReclaimable:
      break;
  }
  // Attempts so far: the claim would make attempt attempts + 1 and resume from recovery_point.
  ClaimResult result = stored_answer(Status::kReclaimed, *seen.row, now);
  result.recovery_point = seen.row->recovery_point;
  return result;
}

bool forget(Session& store, const KeyName& name, const std::optional<pg_uuid_t>& token,
            const Caller& caller, Oid table, TimestampTz now) {
  const std::optional<KeyRow> locked = store.lock(caller.name, name.scope, name.key);
  if (!locked) {
    // None, or locked (SKIP LOCKED) or inserted by another transaction still open.
    const key_store::Session::Look seen =
        store.look(caller.name, name.scope, name.key, name.identity(table, caller.role));
    if (!seen.held_by_open_transaction && !seen.row) return false;
    throw Error(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                "idempotency key " + name.describe() + " is in progress",
                "Another transaction that is still open claims, completes or forgets it.",
                "Try again when that transaction has ended.");
  }
  // A row of an earlier role of the caller's name is no key of the caller's.
  if (!key_store::belongs_to(*locked, caller.role, caller.system)) return false;
  const bool expired = locked->expires_at <= now;
  if (token && !expired && !same_token(locked->lease_token, *token))
    throw Error(
        ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        "token does not hold idempotency key " + name.describe(),
        locked->lease_token ? "The key was claimed with another token." : "The key was released.",
        "Forget it without a token, or pass the token that claim_key returned for it.");
  const bool live_claim = !expired && !locked->completed && locked->lease_token &&
                          locked->locked_until && *locked->locked_until > now;
  if (live_claim && !token)
    throw Error(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                "idempotency key " + name.describe() + " is held by a live claim",
                "The claim's lease ends at " +
                    std::string(pg::errors::timestamp_text(*locked->locked_until)) + ".",
                "Pass the claim's token to forget it, or release or complete it first.");
  if (!store.remove(caller.name, name.scope, name.key)) return false;
  stats::count(stats::kForgotten);
  // Waiters on a claim that is gone now claim the key at once.
  key_wait::touched(name.wait_slot(caller.role));
  return true;
}

KeyRow complete(Session& store, const KeyName& name, const pg_uuid_t& token,
                const key_store::Outcome& given, const Caller& caller, TimestampTz now,
                std::optional<Interval> response_ttl) {
  // The key expires ttl after its completion, in both patterns (SPEC §2): a completion in the
  // claiming transaction counts from now too, not from the claim, or a long transaction
  // would commit a key already expired and the redelivery would run the effect again.
  const own_claims::OwnClaim* own = own_claims::find(token);
  std::optional<TimestampTz> expires_at;
  key_store::RowAddress where = key_store::kNowhere;
  if (own != nullptr) {
    expires_at = add_interval(now, own->ttl);
    where = own->where;
  } else {
    // A fresh snapshot, not the statement's: the claim may have been made earlier in this
    // very statement (claims of more keys than own_claims keeps), invisible to that snapshot.
    std::optional<KeyRow> row = store.find(caller.name, name.scope, name.key, Read::kLatest);
    if (!live_for(row, caller, now)) reject_missing(name);
    expires_at = add_interval(now, row->ttl);
  }
  key_store::Outcome outcome = given;
  if (response_ttl) {
    const TimestampTz response_expires_at = add_interval(now, *response_ttl);
    if (response_expires_at < *expires_at) {
      outcome.response_expires_at = response_expires_at;
      stats::note_response_expiry(MyDatabaseId);  // the cleanup now looks for such responses
    }
  }
  std::optional<KeyRow> row = store.complete(name.scope, name.key, token, owner_of(caller), outcome,
                                             now, *expires_at, where);
  if (row) {
    stats::count(stats::kCompleted);
    key_wait::touched(name.wait_slot(caller.role));
    return *row;
  }
  KeyRow stored = explain_fence(store, name, token, caller, now);
  if (!responses::same_response(stored, outcome))
    throw Error(
        ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        "idempotency key " + name.describe() + " was already completed with another response");
  return stored;  // the same completion again: a no-op success
}

void release(Session& store, const KeyName& name, const pg_uuid_t& token, const Caller& caller,
             TimestampTz now) {
  if (!store.release(name.scope, name.key, token, owner_of(caller), now)) {
    (void)explain_fence(store, name, token, caller, now);
    throw Error(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                "idempotency key " + name.describe() + " is completed and cannot be released");
  }
  key_wait::touched(name.wait_slot(caller.role));
}

TimestampTz checkpoint(Session& store, const KeyName& name, const pg_uuid_t& token,
                       const Caller& caller, text* recovery_point, std::optional<Interval> lease,
                       TimestampTz now) {
  if (!lease) {
    const std::optional<KeyRow> row = store.find(caller.name, name.scope, name.key, Read::kLatest);
    if (!live_for(row, caller, now)) reject_missing(name);
    lease = row->lease;
  }
  const TimestampTz until = add_interval(now, *lease);
  if (!store.checkpoint(name.scope, name.key, token, owner_of(caller), recovery_point, now,
                        until)) {
    (void)explain_fence(store, name, token, caller, now);
    throw Error(
        ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        "idempotency key " + name.describe() + " is completed; there is nothing to checkpoint");
  }
  return until;
}

}  // namespace idem::claim_protocol
