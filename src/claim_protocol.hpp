// The claim protocol (SPEC §3; src/README.md states it with its snapshots, locks and
// invariants): a claim decides, inside the caller's transaction, whether this request does the
// work (claimed / reclaimed) or answers from the stored state (replay / mismatch /
// in_progress); a completion, release or checkpoint is fenced by the claim's token.
//
// The SQL functions (sql_functions.cpp, batches.cpp) read and check their arguments, then run
// these steps on the installation's table as its owner (as_owner).
#pragma once

#include "arguments.hpp"
#include "caller.hpp"
#include "claim_result.hpp"
#include "key_store.hpp"
#include "own_claims.hpp"

namespace idem::claim_protocol {

using arguments::Caller;
using arguments::KeyName;
using claim_result::ClaimResult;
using key_store::KeyRow;
using key_store::Session;

// One claim: its key, the caller, what it asks for, and how long it may wait.
struct ClaimRequest {
  explicit ClaimRequest(KeyName n) : name(n) {}
  KeyName name;
  bytea* fingerprint = nullptr;
  Interval ttl{};
  Interval lease{};
  TimestampTz deadline = 0;  // of waiting (a batch: now, it never waits)
  Caller caller{InvalidOid, nullptr};
  Oid table = InvalidOid;
};

// Claims `request.name` for `request.caller`: claimed or reclaimed (a token), or the stored
// answer (replay, mismatch), or in_progress when another open transaction holds the key past
// the deadline.
ClaimResult claim(Session& store, const ClaimRequest& request);

// Completes the claim `token` of `name`: the stored row, or the row as it was when this very
// completion was made before (a no-op success). Refuses a token that does not hold the key
// (55000, P0002) and another response under the same token (55000).
// `response_ttl` (1.3): the response is dropped that long after the completion, the key kept
// until its ttl (a tombstone); nullopt, or one not shorter than the ttl: kept as long as the key.
KeyRow complete(Session& store, const KeyName& name, const pg_uuid_t& token,
                const key_store::Outcome& outcome, const Caller& caller, TimestampTz now,
                std::optional<Interval> response_ttl = std::nullopt);

// Releases the claim `token` of `name` (the key can be claimed again at once).
void release(Session& store, const KeyName& name, const pg_uuid_t& token, const Caller& caller,
             TimestampTz now);

// Stores `recovery_point` (nullptr: none) under the claim `token` of `name` and renews its
// lease by `lease` (nullopt: the lease the claim was made with); returns the new end of the
// lease.
TimestampTz checkpoint(Session& store, const KeyName& name, const pg_uuid_t& token,
                       const Caller& caller, text* recovery_point, std::optional<Interval> lease,
                       TimestampTz now);

// What claim() would answer now for `name` (look_key, SPEC section 3.5), deciding nothing:
// no claim, no write, no lock kept, no wait. A key a claim would take (none, expired, of an
// earlier role of the caller's name) answers `claimed`, one whose lease ended or that was
// released `reclaimed`, both without a token (nothing was claimed); a key another open
// transaction writes answers in_progress at once. `table` is the installation's (the key lock's
// identity on the executor path).
ClaimResult look(Session& store, const KeyName& name, const bytea* fingerprint,
                 const Caller& caller, Oid table, TimestampTz now);

// Deletes the caller's own key `name` (forget_key, SPEC section 3.5): a completed, released or
// expired key, or one whose lease ended; a key held by a live claim only with `token`, its
// holder's. A token given must be the key's (the holder's, or the one that completed it):
// else 55000, so a handler never forgets a key someone else has claimed since. A key that
// another open transaction writes is refused (55000), never waited for. false: no such key for
// the caller (none, or another role's).
bool forget(Session& store, const KeyName& name, const std::optional<pg_uuid_t>& token,
            const Caller& caller, Oid table, TimestampTz now);

// Runs `work(store, installation)` on the installation of the calling function, as its owner
// (caller.hpp).
template <typename Work>
auto as_owner(FunctionCallInfo fcinfo, Work&& work) {
  const caller::Installation installation = caller::of_function(fcinfo->flinfo->fn_oid);
  caller::ActingAsOwner acting(installation,
                               caller::ActingAsOwner::SearchPath::kBeforeFirstStatement);
  Session store(installation.table, acting);
  auto result = work(static_cast<Session&>(store), installation);
  store.finish();
  return result;
}

}  // namespace idem::claim_protocol
