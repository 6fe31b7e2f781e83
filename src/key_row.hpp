// One row of idempotency_keys as the claim protocol sees it, shared by the two ways the
// table is reached: the executor (key_store) and the heap and indexes directly (key_heap).
#pragma once

#include "pg.hpp"
#include "pg/fmgr.hpp"
#include "reads.hpp"

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
  // The owner's stamp (1.3): the role's OID and the system identifier of the cluster that
  // wrote it; InvalidOid / nullopt where unstamped (a row from 1.2, or written elsewhere).
  Oid owner_oid;
  std::optional<int64> owner_system;
  // When the stored response is dropped (1.3, complete_key's response_ttl): from then on the
  // key is a tombstone that keeps its fingerprint until expires_at. nullopt: the response lives
  // as long as the key.
  std::optional<TimestampTz> response_expires_at;
};

// The role a completion, release or checkpoint acts for: its name (the row's owner) and the
// stamp its rows carry (belongs_to below).
struct Owner {
  text* name;
  Oid role;
  int64 system;
};

// Values of a fresh or renewed claim.
struct ClaimValues {
  text* owner;    // the claiming role's name
  Oid owner_oid;  // its OID, and the cluster's system identifier: the row's stamp
  int64 owner_system;
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
  // The end of the response's life (complete_key's response_ttl); nullopt: the key's.
  std::optional<TimestampTz> response_expires_at;
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
  kRowOwnerOid,
  kRowOwnerSystem,
  kRowResponseExpiresAt,
};
constexpr int kRowColumnCount = kRowResponseExpiresAt;

// ---------------------------------------------------------------------------------------
// The columns of the table: the one list both paths use (the direct path finds each by its
// name, the executor path's statements name them; the scripts create them).
// ---------------------------------------------------------------------------------------

enum Column {
  kScope,
  kKey,
  kOwner,
  kFingerprint,
  kAttempts,
  kTtl,
  kLease,
  kCreatedAt,
  kExpiresAt,
  kLeaseToken,
  kLockedUntil,
  kRecoveryPoint,
  kStatus,
  kResponseCode,
  kUpdatedAt,
  kResponse,
  kResponseBody,
  kResponseHeaders,
  kOwnerOid,
  kOwnerSystem,
  kResponseExpiresAt,
  kColumnCount
};
// Each column as the scripts create it (1.0, the response as sent added by 1.2, the owner's
// stamp and the response's own expiry by 1.3). A NOT NULL
// added to another column is a constraint the direct path would not check, so such a table goes to
// the executor. The status column is the extension's enum, checked by its kind (type InvalidOid
// here). `claim_writes`: the executor's INSERT of a claim lists the column, so a default of it is
// never used; for the others the executor would fill in their default.
struct ColumnSpec {
  const char* name;
  Oid type;
  const char* type_name;
  bool not_null;
  bool claim_writes;
};
constexpr ColumnSpec kColumns[kColumnCount] = {
    {"scope", TEXTOID, "text", true, true},
    {"key", TEXTOID, "text", true, true},
    {"owner", TEXTOID, "text", true, true},
    {"fingerprint", BYTEAOID, "bytea", false, true},
    {"attempts", INT4OID, "integer", true, true},
    {"ttl", INTERVALOID, "interval", true, true},
    {"lease", INTERVALOID, "interval", true, true},
    {"created_at", TIMESTAMPTZOID, "timestamptz", true, true},
    {"expires_at", TIMESTAMPTZOID, "timestamptz", true, true},
    {"lease_token", UUIDOID, "uuid", false, true},
    {"locked_until", TIMESTAMPTZOID, "timestamptz", false, true},
    {"recovery_point", TEXTOID, "text", false, false},
    {"status", InvalidOid, "key_status", true, true},
    {"response_code", INT4OID, "integer", false, false},
    {"updated_at", TIMESTAMPTZOID, "timestamptz", true, true},
    {"response", JSONBOID, "jsonb", false, false},
    {"response_body", BYTEAOID, "bytea", false, false},
    {"response_headers", JSONBOID, "jsonb", false, false},
    {"owner_oid", OIDOID, "oid", false, true},
    {"owner_system", INT8OID, "bigint", false, true},
    {"response_expires_at", TIMESTAMPTZOID, "timestamptz", false, false},
};
// The column behind each RowColumn (index 0 unused).
constexpr Column kRowColumnSource[] = {
    kStatus,     kStatus,       kFingerprint,     kResponse, kResponseCode, kRecoveryPoint,
    kLeaseToken, kLockedUntil,  kAttempts,        kTtl,      kCreatedAt,    kExpiresAt,
    kLease,      kResponseBody, kResponseHeaders, kOwnerOid, kOwnerSystem,  kResponseExpiresAt};
static_assert(sizeof kRowColumnSource / sizeof kRowColumnSource[0] ==
                  key_store::kRowColumnCount + 1,
              "one source column per RowColumn");

// Is a row of the caller's name the caller's own? A row stamped in this cluster (system
// identifier `system`) must carry the caller's OID: under another, it was written by an
// earlier role of the same name (dropped, or renamed away), and counts as absent, like an
// expired row. An unstamped row (from 1.2) or one stamped in another cluster (a dump
// restored, a row replicated, moved or upgraded from elsewhere) is adopted by name, as
// pg_dump matches object owners.
inline bool belongs_to(const KeyRow& row, Oid role, int64 system) {
  return !row.owner_system || *row.owner_system != system || !OidIsValid(row.owner_oid) ||
         row.owner_oid == role;
}

// The same bytes (a fingerprint, a body): equal lengths and contents.
inline bool same_bytes(const bytea* a, const bytea* b) {
  return VARSIZE_ANY_EXHDR(a) == VARSIZE_ANY_EXHDR(b) &&
         memcmp(VARDATA_ANY(a), VARDATA_ANY(b), VARSIZE_ANY_EXHDR(a)) == 0;
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
    return pg::fmgr::detoast_copy(value, context);
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
  Datum owner_oid = column(kRowOwnerOid, &is_null);
  row.owner_oid = is_null ? InvalidOid : DatumGetObjectId(owner_oid);
  Datum owner_system = column(kRowOwnerSystem, &is_null);
  if (!is_null) row.owner_system = DatumGetInt64(owner_system);
  Datum response_expires_at = column(kRowResponseExpiresAt, &is_null);
  if (!is_null) row.response_expires_at = DatumGetTimestampTz(response_expires_at);
  return row;
}

}  // namespace idem::key_store
