// Results as claim_result values (claim_result.hpp).
#include "claim_result.hpp"

#include "result_scan.hpp"
#include "pg/types.hpp"

namespace idem::claim_result {
namespace {

constexpr const char* kStatusLabels[] = {"claimed", "reclaimed", "replay", "mismatch",
                                         "in_progress"};

// The OIDs of the claim_status labels, looked up once per backend (per call site would
// repeat catalog lookups on every execution of a prepared statement), and the claim_result
// type whose status column has that type. Keyed by the types' OIDs, which change if the
// extension is recreated; forgotten when pg_enum changes (forget_result_type).
struct Labels {
  Oid status_type = InvalidOid;
  Oid oids[5] = {};
};
Labels labels;
struct ResultType {
  Oid type = InvalidOid;
  Oid status_type = InvalidOid;
};
ResultType result_type;

// The label OIDs of the enum `status_type`, loaded when it changed.
const Oid* status_labels(Oid status_type) {
  if (status_type == labels.status_type) return labels.oids;
  Labels loaded;
  for (int i = 0; i < 5; ++i) {
    loaded.oids[i] = pg::types::enum_label(status_type, kStatusLabels[i]);
    if (!OidIsValid(loaded.oids[i]))
      throw Error(ERRCODE_UNDEFINED_OBJECT,
                  std::string("claim_status has no label \"") + kStatusLabels[i] + "\"");
  }
  loaded.status_type = status_type;
  labels = loaded;
  return labels.oids;
}

// Returns the claim_result OID of this call, loading its status type when it changed.
Oid claim_result_type(FunctionCallInfo fcinfo) {
  const Oid type = pg::types::call_result_type(fcinfo);
  if (type == result_type.type) return type;
  const Oid status_type = pg::types::first_field_type(type);
  result_type = {type, status_type};
  return type;
}

// ALTER TYPE ... RENAME VALUE keeps a label's OID under a new name: look the labels up again.
void forget_result_type(Datum, SyscacheId, uint32) {
  result_type.type = InvalidOid;
  labels.status_type = InvalidOid;
}

}  // namespace

void fill(const ClaimResult& result, Oid status_type, Datum* values, bool* nulls,
          ResultStorage& storage, int fields) {
  const Oid* label = status_labels(status_type);
  for (int i = 0; i < fields; ++i) nulls[i] = true;
  auto set = [&](int column, Datum value) {
    values[column] = value;
    nulls[column] = false;
  };
  set(0, ObjectIdGetDatum(label[static_cast<int>(result.status)]));
  if (result.token) {
    storage.token = *result.token;
    set(1, UUIDPGetDatum(&storage.token));
  }
  if (result.response) set(2, PointerGetDatum(result.response));
  if (result.response_code) set(3, Int32GetDatum(*result.response_code));
  if (result.fingerprint) set(4, PointerGetDatum(result.fingerprint));
  if (result.recovery_point) set(5, PointerGetDatum(result.recovery_point));
  if (result.attempts) set(6, Int32GetDatum(*result.attempts));
  if (result.created_at) set(7, TimestampTzGetDatum(*result.created_at));
  if (result.expires_at) set(8, TimestampTzGetDatum(*result.expires_at));
  if (result.retry_after_us) {
    storage.retry_after.time = *result.retry_after_us;
    set(9, IntervalPGetDatum(&storage.retry_after));
  }
  if (result.response_body) set(10, PointerGetDatum(result.response_body));
  if (result.response_headers) set(11, PointerGetDatum(result.response_headers));
  if (fields > 12 && result.response_dropped) set(12, BoolGetDatum(*result.response_dropped));
}

Datum as_datum(FunctionCallInfo fcinfo, const ClaimResult& result) {
  Oid type = claim_result_type(fcinfo);
  // Called by our scan in FROM: the columns go straight into its row.
  result_scan::DirectRow* row = result_scan::direct_row(fcinfo);
  if (row != nullptr && row->columns == kResultFields) {
    fill(result, result_type.status_type, row->values, row->nulls, row->storage);
    row->filled = true;
    return Datum(0);
  }
  Datum values[kResultFields];
  bool nulls[kResultFields];
  ResultStorage storage;
  fill(result, result_type.status_type, values, nulls, storage);
  // The type cache's descriptor of a named composite type needs no blessing.
  // A claim_result of an older version (before ALTER EXTENSION UPDATE) has fewer fields.
  return pg::types::composite(type, kResultFields, values, nulls, "claim_result",
                              "Run ALTER EXTENSION idempotency UPDATE in this database.");
}

ClaimResult stored_answer(Status status, const key_store::KeyRow& row, TimestampTz now) {
  ClaimResult result(status);
  if (status == Status::kReplay) {
    const bool dropped = row.response_expires_at && *row.response_expires_at <= now;
    result.response_dropped = dropped;
    result.response_code = row.response_code;
    if (!dropped) {
      result.response = row.response;
      result.response_body = row.response_body;
      result.response_headers = row.response_headers;
    }
  }
  result.fingerprint = row.fingerprint;
  result.recovery_point = status == Status::kReplay ? row.recovery_point : nullptr;
  result.attempts = row.attempts;
  result.created_at = row.created_at;
  result.expires_at = row.expires_at;
  return result;
}

void on_load() {
  CacheRegisterSyscacheCallback(ENUMOID, forget_result_type, 0);
}

}  // namespace idem::claim_result
