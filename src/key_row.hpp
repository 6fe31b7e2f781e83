// One row of idempotency_keys as the claim protocol sees it, shared by the two ways the
// table is reached: the executor (key_store) and the heap and indexes directly (key_heap).
#pragma once

#include "pg.hpp"
#include "pg_boundary.hpp"

namespace idem::key_store {

// The caller's view of one stored row. Varlena values are copied into the memory context
// that was current when the Session was opened, so they outlive the SPI connection.
struct KeyRow {
  bool completed;
  bytea* fingerprint;  // nullptr = NULL
  Jsonb* response;     // nullptr = NULL
  std::optional<int32> response_code;
  bytea* response_body;     // nullptr = NULL
  Jsonb* response_headers;  // nullptr = NULL
  text* recovery_point;     // nullptr = NULL
  std::optional<pg_uuid_t> lease_token;
  std::optional<TimestampTz> locked_until;
  int32 attempts;
  Interval ttl;
  Interval lease;  // the lease the claim was made with (checkpoint_key renews by it)
  TimestampTz created_at;
  TimestampTz expires_at;
};

// Values of a fresh or renewed claim.
struct ClaimValues {
  text* owner;         // the claiming role's name
  bytea* fingerprint;  // nullptr = NULL
  pg_uuid_t token;
  TimestampTz now;
  TimestampTz locked_until;
  TimestampTz expires_at;
  Interval ttl;
  Interval lease;
};

// The stored outcome of a completion: the jsonb response and code of 1.0, and from 1.2 the
// response as sent (its body's bytes and its headers), each optional.
struct Outcome {
  Jsonb* response;  // nullptr = NULL
  std::optional<int32> response_code;
  bytea* response_body;     // nullptr = NULL
  Jsonb* response_headers;  // nullptr = NULL (a JSON object of strings or string arrays)
};

// Where a row written directly lives: its TID in one file of the table. A TRUNCATE or
// CLUSTER in the same transaction usually gives the table a new file, where the TID means
// nothing; a TRUNCATE of a file that this transaction created empties it in place, so the
// TID may also point past the file's end (key_heap checks both before reading it).
struct RowAddress {
  ItemPointerData tid;
  Oid file;
  bool valid() const { return ItemPointerIsValid(&tid); }
};
// The address of a row not written directly.
constexpr RowAddress kNowhere = {{{0, 0}, InvalidOffsetNumber}, InvalidOid};

// The columns a KeyRow is read from, in the order decode_columns numbers them (1-based).
enum RowColumn {
  kRowStatus = 1,
  kRowFingerprint,
  kRowResponse,
  kRowResponseCode,
  kRowRecoveryPoint,
  kRowLeaseToken,
  kRowLockedUntil,
  kRowAttempts,
  kRowTtl,
  kRowCreatedAt,
  kRowExpiresAt,
  kRowLease,
  kRowResponseBody,
  kRowResponseHeaders,
};

// As INSERT .. ON CONFLICT does: a transaction that reads with one snapshot (REPEATABLE READ,
// SERIALIZABLE) cannot decide from a version of the key committed after that snapshot. Both
// paths raise it where they find such a version.
// pg-frame: raises; called inside pg_call.
inline void raise_committed_after_snapshot(text* key) {
  ereport(ERROR, (errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
                  errmsg("could not serialize access due to concurrent update"),
                  errdetail("Idempotency key \"%s\" was written by a transaction that "
                            "committed after this transaction's snapshot.",
                            text_to_cstring(key))));
}

// Builds a KeyRow from `column(number, &is_null)` (numbers of RowColumn; the status is
// passed as `completed`), copying varlena values into `context` so they outlive the scan.
// A NULL where the table has NOT NULL is refused, never dereferenced.
template <typename ColumnReader>
KeyRow decode_columns(ColumnReader&& column, bool completed, MemoryContext context) {
  auto required = [&](int number) {
    bool is_null = false;
    Datum value = column(number, &is_null);
    if (is_null)
      throw Error(ERRCODE_NOT_NULL_VIOLATION, "idempotency_keys holds a NULL where none may be",
                  "Column " + std::to_string(number) + " of the key row is NULL.");
    return value;
  };
  auto copy_varlena = [&](int number) -> struct varlena* {
    bool is_null = false;
    Datum value = column(number, &is_null);
    if (is_null) return nullptr;
    return pg_call([&] {
      MemoryContext old = MemoryContextSwitchTo(context);
      struct varlena* copy = PG_DETOAST_DATUM_COPY(value);
      MemoryContextSwitchTo(old);
      return copy;
    });
  };
  KeyRow row{};
  bool is_null = false;
  row.completed = completed;
  row.fingerprint = reinterpret_cast<bytea*>(copy_varlena(kRowFingerprint));
  row.response = reinterpret_cast<Jsonb*>(copy_varlena(kRowResponse));
  Datum code = column(kRowResponseCode, &is_null);
  if (!is_null) row.response_code = DatumGetInt32(code);
  row.response_body = reinterpret_cast<bytea*>(copy_varlena(kRowResponseBody));
  row.response_headers = reinterpret_cast<Jsonb*>(copy_varlena(kRowResponseHeaders));
  row.recovery_point = reinterpret_cast<text*>(copy_varlena(kRowRecoveryPoint));
  Datum token = column(kRowLeaseToken, &is_null);
  if (!is_null) row.lease_token = *DatumGetUUIDP(token);
  Datum locked_until = column(kRowLockedUntil, &is_null);
  if (!is_null) row.locked_until = DatumGetTimestampTz(locked_until);
  row.attempts = DatumGetInt32(required(kRowAttempts));
  row.ttl = *DatumGetIntervalP(required(kRowTtl));
  row.lease = *DatumGetIntervalP(required(kRowLease));
  row.created_at = DatumGetTimestampTz(required(kRowCreatedAt));
  row.expires_at = DatumGetTimestampTz(required(kRowExpiresAt));
  return row;
}

}  // namespace idem::key_store
