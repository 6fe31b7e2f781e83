// The answer of a claim, a completion or a batch element: a claim_result, built from C++
// values with the labels of this database's claim_status type.
#pragma once

#include "key_row.hpp"

namespace idem::claim_result {

enum class Status { kClaimed, kReclaimed, kReplay, kMismatch, kInProgress };

// The fields of a claim_result; absent optionals become NULL.
struct ClaimResult {
  explicit ClaimResult(Status s) : status(s) {}
  Status status;
  std::optional<pg_uuid_t> token = std::nullopt;
  Jsonb* response = nullptr;
  std::optional<int32> response_code = std::nullopt;
  bytea* fingerprint = nullptr;
  bytea* response_body = nullptr;
  Jsonb* response_headers = nullptr;
  text* recovery_point = nullptr;
  std::optional<int32> attempts = std::nullopt;
  std::optional<TimestampTz> created_at = std::nullopt;
  std::optional<TimestampTz> expires_at = std::nullopt;
  std::optional<int64> retry_after_us = std::nullopt;
  // 1.3: a replay of a key whose response was dropped (response_ttl passed): true, the
  // response, body and headers NULL, response_code kept. false for any other replay; NULL for
  // the other statuses.
  std::optional<bool> response_dropped = std::nullopt;
};

// The fields of claim_result (1.3), and of the claim_result columns of the batch functions'
// rows (claim_keys, complete_keys), which have no response_dropped (a dropped response shows
// there as a replay with a response_code and no response).
constexpr int kResultFields = 13;
constexpr int kBatchResultFields = 12;

// Storage that the Datums of one result point to, for as long as they are used.
struct ResultStorage {
  pg_uuid_t token{};
  Interval retry_after{};
};

// The claim_result fields of `result` into values / nulls (kResultFields of each), with the
// labels of the enum `status_type` (a batch's status column type).
void fill(const ClaimResult& result, Oid status_type, Datum* values, bool* nulls,
          ResultStorage& storage, int fields = kResultFields);

// `result` as the claim_result Datum that the calling function returns.
Datum as_datum(FunctionCallInfo fcinfo, const ClaimResult& result);

// What a duplicate may see of a stored row: the outcome, never the holder's token; the
// response and the recovery point only with a replay.
// A replay at `now` of a row whose response_expires_at has passed carries no response, body or
// headers, and says so (response_dropped).
ClaimResult stored_answer(Status status, const key_store::KeyRow& row, TimestampTz now);

// Registers the syscache callback that forgets the cached label and type OIDs; called from
// _PG_init.
void on_load();

}  // namespace idem::claim_result
