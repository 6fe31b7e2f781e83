// The claims the current transaction made, remembered until it ends: a completion in the
// same transaction (the inbox pattern) takes the claim's ttl from here and finds the row the
// claim inserted by its address, without reading the table first.
#pragma once

#include "key_row.hpp"

namespace idem::own_claims {

// Tokens claimed in the current transaction. When complete_key runs in the same transaction
// (the inbox pattern) it knows the claim's ttl without reading the row, and completes the row
// the claim inserted directly, found by its address. Cleared at transaction end.
struct OwnClaim {
  pg_uuid_t token;
  Interval ttl;                     // the key lives this long after its completion
  key_store::RowAddress where;      // the inserted row, or kNowhere
  SubTransactionId subtransaction;  // where the claim was made
};
// Remembers the claim `token` (made in the current subtransaction), with its ttl and the
// address of the row it inserted (kNowhere when the executor wrote it). Beyond
// kOwnClaimsKept claims per transaction nothing more is remembered: those completions take
// the executor path.
void remember(const pg_uuid_t& token, const Interval& ttl, const key_store::RowAddress& where);
// The claim `token` of this transaction, or nullptr (not made here, rolled back, or not
// remembered). Cannot raise.
const OwnClaim* find(const pg_uuid_t& token);

// Registers the transaction callbacks that forget the claims at transaction end and at a
// subtransaction's rollback; called from _PG_init.
void on_load();

}  // namespace idem::own_claims
