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

#include "caller.hpp"
#include "gucs.hpp"
#include "key_lock.hpp"
#include "key_wait.hpp"
#include "key_store.hpp"
#include "pg_boundary.hpp"
#include "stats.hpp"
#include "uuid_v7.hpp"

namespace idem::claim_protocol {
namespace {

using key_store::KeyRow;
using key_store::Session;

// ---------------------------------------------------------------------------------------
// Arguments
// ---------------------------------------------------------------------------------------

// A key or scope argument, detoasted, with its bytes at hand for the key lock.
struct KeyName {
  text* scope;
  text* key;
  // The key lock's identity of this name when `owner` claims it in `table`.
  key_lock::KeyIdentity identity(Oid table, Oid owner) const {
    return {table, owner, scope_bytes(), scope_length(), key_bytes(), key_length()};
  }
  // The slot of this name's waiters when `owner` claims it (key_wait.hpp).
  uint32 wait_slot(Oid owner) const {
    return key_wait::slot_of(owner, scope_bytes(), scope_length(), key_bytes(), key_length());
  }
  const char* scope_bytes() const { return VARDATA_ANY(scope); }
  size_t scope_length() const { return VARSIZE_ANY_EXHDR(scope); }
  const char* key_bytes() const { return VARDATA_ANY(key); }
  size_t key_length() const { return VARSIZE_ANY_EXHDR(key); }
  // 'key' or 'scope/key', for messages.
  std::string describe() const {
    std::string name(key_bytes(), key_length());
    if (scope_length() == 0) return "\"" + name + "\"";
    return "\"" + name + "\" in scope \"" + std::string(scope_bytes(), scope_length()) + "\"";
  }
};

// Who calls: the role (current_user) and its name, which is what the table stores as the
// key's owner (caller::name_of).
struct Caller {
  Oid role;
  text* name;
};

Caller calling(const char* function_name) {
  const Oid role = caller::calling_role(function_name);
  return {role, caller::name_of(role)};
}

text* text_argument(FunctionCallInfo fcinfo, int n) {
  return pg_call([&] { return PG_GETARG_TEXT_PP(n); });
}

[[noreturn]] void reject_null_key() {
  throw Error(ERRCODE_NULL_VALUE_NOT_ALLOWED, "idempotency key must not be null");
}
[[noreturn]] void reject_null_scope() {
  throw Error(ERRCODE_NULL_VALUE_NOT_ALLOWED, "idempotency scope must not be null", {},
              "Use '' (the default) for keys without a scope.");
}

// A key and scope that are not NULL, checked against the limits.
KeyName checked_name(text* scope, text* key) {
  KeyName name{scope, key};
  const auto limit = static_cast<size_t>(gucs::max_key_length);
  if (name.key_length() == 0)
    throw Error(ERRCODE_INVALID_PARAMETER_VALUE, "idempotency key must not be empty");
  if (name.key_length() > limit)
    throw Error(ERRCODE_STRING_DATA_RIGHT_TRUNCATION, "idempotency key is too long",
                "The key has " + std::to_string(name.key_length()) +
                    " bytes; idempotency.max_key_length is " + std::to_string(limit) + ".");
  if (name.scope_length() > limit)
    throw Error(ERRCODE_STRING_DATA_RIGHT_TRUNCATION, "idempotency scope is too long",
                "The scope has " + std::to_string(name.scope_length()) +
                    " bytes; idempotency.max_key_length is " + std::to_string(limit) + ".");
  return name;
}

KeyName key_arguments(FunctionCallInfo fcinfo, int key_arg, int scope_arg) {
  if (PG_ARGISNULL(key_arg)) reject_null_key();
  if (PG_ARGISNULL(scope_arg)) reject_null_scope();
  return checked_name(text_argument(fcinfo, scope_arg), text_argument(fcinfo, key_arg));
}

pg_uuid_t token_argument(FunctionCallInfo fcinfo, int n) {
  if (PG_ARGISNULL(n))
    throw Error(ERRCODE_NULL_VALUE_NOT_ALLOWED, "token must not be null", {},
                "Pass the token that claim_key returned.");
  return *PG_GETARG_UUID_P(n);
}

Interval seconds_interval(int seconds) {
  Interval interval{};
  interval.time = int64{seconds} * USECS_PER_SEC;
  return interval;
}

// An interval argument as one span of microseconds, a month counted as 30 days and a day as
// 24 hours (as PostgreSQL compares intervals): what a ttl, lease or wait means is then the
// same on every calendar day, and '1 mon -31 days' is negative in December too.
Interval as_span(const Interval& interval, const char* name) {
  const __int128 span = static_cast<__int128>(interval.time) +
                        static_cast<__int128>(interval.day) * USECS_PER_DAY +
                        static_cast<__int128>(interval.month) * DAYS_PER_MONTH * USECS_PER_DAY;
  if (span > PG_INT64_MAX || span < PG_INT64_MIN)
    throw Error(ERRCODE_INVALID_PARAMETER_VALUE, std::string(name) + " is out of range");
  Interval result{};
  result.time = static_cast<int64>(span);
  return result;
}

TimestampTz add_interval(TimestampTz time, const Interval& interval) {
  return pg_call([&] {
    return DatumGetTimestampTz(DirectFunctionCall2(
        timestamptz_pl_interval, TimestampTzGetDatum(time), IntervalPGetDatum(&interval)));
  });
}

// An optional interval argument (ttl, lease) that must be positive and at most
// idempotency.max_<name>; NULL takes idempotency.default_<name>, which any role can set and
// which is therefore held to the same maximum.
Interval bounded_interval_argument(FunctionCallInfo fcinfo, int n, const char* name,
                                   int default_seconds, int max_seconds) {
  const std::string setting = std::string("idempotency.default_") + name;
  const std::string limit = std::string("idempotency.max_") + name;
  if (PG_ARGISNULL(n)) {
    if (default_seconds > max_seconds)
      throw Error(ERRCODE_INVALID_PARAMETER_VALUE, setting + " exceeds " + limit,
                  setting + " is " + std::to_string(default_seconds) + " s; " + limit + " is " +
                      std::to_string(max_seconds) + " s.");
    return seconds_interval(default_seconds);
  }
  Interval interval = as_span(*PG_GETARG_INTERVAL_P(n), name);
  if (interval.time <= 0)
    throw Error(ERRCODE_INVALID_PARAMETER_VALUE, std::string(name) + " must be positive",
                "Pass NULL to use " + setting + ".");
  if (interval.time > int64{max_seconds} * USECS_PER_SEC)
    throw Error(ERRCODE_INVALID_PARAMETER_VALUE, std::string(name) + " exceeds " + limit,
                limit + " is " + std::to_string(max_seconds) + " s.");
  return interval;
}

// An optional bytea or text argument of at most `limit` bytes (the fingerprint, the recovery
// point), measured before it is detoasted: an oversized value is refused without being read.
struct varlena* bounded_varlena(Datum raw, const char* name, const char* setting, int limit) {
  size_t size = pg_call([&] { return toast_raw_datum_size(raw); }) - VARHDRSZ;
  if (size > static_cast<size_t>(limit))
    throw Error(ERRCODE_STRING_DATA_RIGHT_TRUNCATION, std::string(name) + " is too long",
                "The " + std::string(name) + " has " + std::to_string(size) + " bytes; " + setting +
                    " is " + std::to_string(limit) + ".");
  return pg_call([&] { return PG_DETOAST_DATUM_PACKED(raw); });
}

struct varlena* bounded_varlena_argument(FunctionCallInfo fcinfo, int n, const char* name,
                                         const char* setting, int limit) {
  if (PG_ARGISNULL(n)) return nullptr;
  return bounded_varlena(PG_GETARG_DATUM(n), name, setting, limit);
}

bytea* fingerprint_value(Datum raw) {
  return reinterpret_cast<bytea*>(bounded_varlena(
      raw, "fingerprint", "idempotency.max_fingerprint_size", gucs::max_fingerprint_size));
}

// An argument that may be left out: false when it is NULL, or when the function's SQL
// definition does not have it (the 1.1 definitions of complete_key / complete_keys, called
// through this library before ALTER EXTENSION UPDATE: reading past PG_NARGS() would read
// memory that holds no argument).
bool argument_given(FunctionCallInfo fcinfo, int n) {
  return n < PG_NARGS() && !PG_ARGISNULL(n);
}

// ---------------------------------------------------------------------------------------
// Responses: the jsonb response, and the response as sent (body bytes, headers)
// ---------------------------------------------------------------------------------------

// The parts of an outcome as the call passed them, not yet detoasted.
struct ResponseArguments {
  std::optional<Datum> response;  // jsonb
  std::optional<int32> code;
  std::optional<Datum> body;     // bytea
  std::optional<Datum> headers;  // jsonb
};

// Why response headers are refused.
enum class HeadersProblem { kNone, kNotObject, kName, kValue, kElement, kControl };
// What check_headers found: trivially destructible, so that it can leave a pg_call. `name`
// points into the headers' jsonb.
struct HeadersCheck {
  HeadersProblem problem = HeadersProblem::kNone;
  const char* name = nullptr;
  int name_length = 0;
  int element = 0;        // 1-based, in the header's array (kElement, kControl)
  const char* kind = "";  // what the offending value is ("a number", ...)
};

// A header name must be an RFC 9110 token: non-empty, of tchar only. Nothing else can be
// sent as a field name, and a replay must never write a CR or LF into a response head.
bool is_field_name(const char* name, int length) {
  if (length == 0) return false;
  for (int i = 0; i < length; ++i) {
    const auto c = static_cast<unsigned char>(name[i]);
    const bool alnum = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    if (!alnum && strchr("!#$%&'*+-.^_`|~", c) == nullptr) return false;
  }
  return true;
}

// A field value holds no control character but horizontal tab (RFC 9110 field-value).
bool is_field_value(const JsonbValue& value) {
  for (int i = 0; i < value.val.string.len; ++i) {
    const auto c = static_cast<unsigned char>(value.val.string.val[i]);
    if ((c < 0x20 && c != '\t') || c == 0x7f) return false;
  }
  return true;
}

const char* kind_of(const JsonbValue& value) {
  switch (value.type) {
    case jbvNull:
      return "null";
    case jbvString:
      return "a string";
    case jbvNumeric:
      return "a number";
    case jbvBool:
      return "a boolean";
    case jbvBinary:
      return JsonContainerIsArray(value.val.binary.data) ? "an array" : "an object";
    default:
      return "of another kind";
  }
}

// Walks the headers: a JSON object whose values are strings or arrays of strings. Allocates
// (the iterators) in the current memory context; call it through pg_call.
// pg-frame: runs inside pg_call only (owns no C++ object).
HeadersCheck check_headers(Jsonb* headers) {
  HeadersCheck check;
  if (!JB_ROOT_IS_OBJECT(headers)) {
    check.problem = HeadersProblem::kNotObject;
    JsonbValue scalar;
    check.kind = JB_ROOT_IS_SCALAR(headers) && JsonbExtractScalar(&headers->root, &scalar)
                     ? kind_of(scalar)
                     : "an array";
    return check;
  }
  JsonbIterator* fields = JsonbIteratorInit(&headers->root);
  JsonbValue value;
  for (JsonbIteratorToken token; (token = JsonbIteratorNext(&fields, &value, true)) != WJB_DONE;) {
    if (token == WJB_KEY) {
      check.name = value.val.string.val;
      check.name_length = value.val.string.len;
      if (!is_field_name(check.name, check.name_length)) {
        check.problem = HeadersProblem::kName;
        return check;
      }
      continue;
    }
    if (token != WJB_VALUE) continue;
    if (value.type == jbvString) {
      if (!is_field_value(value)) check.problem = HeadersProblem::kControl;
    } else if (value.type == jbvBinary && JsonContainerIsArray(value.val.binary.data)) {
      JsonbIterator* elements = JsonbIteratorInit(value.val.binary.data);
      JsonbValue element;
      for (JsonbIteratorToken e; (e = JsonbIteratorNext(&elements, &element, true)) != WJB_DONE;) {
        if (e != WJB_ELEM) continue;
        ++check.element;
        if (element.type != jbvString) {
          check.problem = HeadersProblem::kElement;
          check.kind = kind_of(element);
          return check;
        }
        if (!is_field_value(element)) {
          check.problem = HeadersProblem::kControl;
          return check;
        }
      }
      check.element = 0;
    } else {
      check.problem = HeadersProblem::kValue;
      check.kind = kind_of(value);
    }
    if (check.problem != HeadersProblem::kNone) return check;
  }
  return check;
}

// A header name for a message: at most 64 bytes of it (whole characters), control
// characters shown as \xNN.
std::string shown_name(const HeadersCheck& check) {
  const int length = pg_call([&] { return pg_mbcliplen(check.name, check.name_length, 64); });
  std::string shown;
  for (int i = 0; i < length; ++i) {
    const auto c = static_cast<unsigned char>(check.name[i]);
    if (c >= 0x20 && c != 0x7f) {
      shown += static_cast<char>(c);
      continue;
    }
    constexpr const char* kHex = "0123456789abcdef";
    shown += std::string("\\x") + kHex[c >> 4] + kHex[c & 15];
  }
  return "\"" + shown + (length < check.name_length ? "...\"" : "\"");
}

// The headers, refused (22023) unless a JSON object whose values are strings or arrays of
// strings, with names that are HTTP field names and values without control characters.
void validate_headers(Jsonb* headers) {
  const HeadersCheck check = pg_call([&] { return check_headers(headers); });
  const auto invalid = [](const std::string& message, const std::string& detail) {
    return Error(ERRCODE_INVALID_PARAMETER_VALUE, message, detail,
                 "Pass a JSON object of header names and values, a value being a string or an "
                 "array of strings: {\"Content-Type\": \"text/plain\", \"Vary\": [\"Accept\"]}.");
  };
  const std::string where = check.element > 0
                                ? "Element " + std::to_string(check.element) + " of its array"
                                : "Its value";
  switch (check.problem) {
    case HeadersProblem::kNone:
      return;
    case HeadersProblem::kNotObject:
      throw invalid("response headers must be a JSON object",
                    std::string("The headers are ") + check.kind + ".");
    case HeadersProblem::kName:
      throw invalid("response header name " + shown_name(check) + " is not an HTTP field name",
                    "A field name is a non-empty token (RFC 9110): letters, digits and "
                    "!#$%&'*+-.^_`|~.");
    case HeadersProblem::kValue:
    case HeadersProblem::kElement:
      throw invalid(
          "response header " + shown_name(check) + " must be a string or an array of strings",
          where + " is " + check.kind + ".");
    case HeadersProblem::kControl:
      throw invalid("response header " + shown_name(check) + " has a control character",
                    where +
                        " holds a control character other than horizontal tab, which no "
                        "HTTP field value may hold.");
  }
}

// The outcome of a completion. The response's parts together (the jsonb response, the body,
// the headers) are refused when over idempotency.max_response_size, each measured before
// it is detoasted (its uncompressed size, header included), so that an oversized value is
// never read; the headers are validated. Nothing beyond today's work when only the jsonb
// response and the code are given.
key_store::Outcome outcome_value(const ResponseArguments& given) {
  const auto size_of = [](const std::optional<Datum>& value) -> size_t {
    if (!value) return 0;
    const Datum raw = *value;
    return pg_call([&] { return toast_raw_datum_size(raw); });
  };
  const size_t response_size = size_of(given.response);
  const size_t body_size = size_of(given.body);
  const size_t headers_size = size_of(given.headers);
  const size_t size = response_size + body_size + headers_size;
  if (size > static_cast<size_t>(gucs::max_response_size))
    throw Error(ERRCODE_PROGRAM_LIMIT_EXCEEDED, "response is too large",
                "The response has " + std::to_string(size) + " bytes (response " +
                    std::to_string(response_size) + ", response_body " + std::to_string(body_size) +
                    ", response_headers " + std::to_string(headers_size) +
                    "); idempotency.max_response_size is " +
                    std::to_string(gucs::max_response_size) + ".");
  key_store::Outcome outcome{};
  outcome.response_code = given.code;
  if (given.response) outcome.response = pg_call([&] { return DatumGetJsonbP(*given.response); });
  if (given.body)
    outcome.response_body =
        reinterpret_cast<bytea*>(pg_call([&] { return PG_DETOAST_DATUM_PACKED(*given.body); }));
  if (given.headers) {
    outcome.response_headers = pg_call([&] { return DatumGetJsonbP(*given.headers); });
    validate_headers(outcome.response_headers);
  }
  return outcome;
}

// ---------------------------------------------------------------------------------------
// Claims made by the current transaction
// ---------------------------------------------------------------------------------------

// Tokens claimed in the current transaction. When complete_key runs in the same transaction
// (the inbox pattern) it knows the claim's ttl without reading the row, and completes the row
// the claim inserted directly, found by its address. Cleared at transaction end.
struct OwnClaim {
  pg_uuid_t token;
  Interval ttl;                     // the key lives this long after its completion
  key_store::RowAddress where;      // the inserted row, or kNowhere
  SubTransactionId subtransaction;  // where the claim was made
};
// The first claims of a transaction live in a small array (the common case: a few per
// transaction, nothing to allocate or clear); a batch's further claims in a hash table in
// TopTransactionContext (accounted, and gone with the transaction), up to kOwnClaimsKept in
// all. A claim not remembered is completed by the executor path.
constexpr size_t kOwnClaimsInArray = 64;
constexpr size_t kOwnClaimsKept = 100000;
std::array<OwnClaim, kOwnClaimsInArray> own_claims;
size_t own_claim_count = 0;
HTAB* more_own_claims = nullptr;  // entries: OwnClaim, keyed by its token (the first field)
size_t more_own_claim_count = 0;

void remember_own_claim(const pg_uuid_t& token, const Interval& ttl,
                        const key_store::RowAddress& where) {
  const OwnClaim claim{token, ttl, where, GetCurrentSubTransactionId()};
  if (own_claim_count < kOwnClaimsInArray) {
    own_claims[own_claim_count++] = claim;
    return;
  }
  if (own_claim_count + more_own_claim_count >= kOwnClaimsKept) return;
  pg_call([&] {
    if (more_own_claims == nullptr) {
      HASHCTL control{};
      control.keysize = sizeof(pg_uuid_t);
      control.entrysize = sizeof(OwnClaim);
      control.hcxt = TopTransactionContext;
      more_own_claims = hash_create("idempotency claims of this transaction", 1024, &control,
                                    HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
    }
    bool found = false;
    auto* entry = static_cast<OwnClaim*>(hash_search(more_own_claims, &token, HASH_ENTER, &found));
    *entry = claim;
    if (!found) ++more_own_claim_count;
  });
}

const OwnClaim* own_claim(const pg_uuid_t& token) {
  for (size_t i = 0; i < own_claim_count; ++i)
    if (memcmp(own_claims[i].token.data, token.data, UUID_LEN) == 0) return &own_claims[i];
  if (more_own_claims == nullptr) return nullptr;
  // A lookup allocates nothing and cannot fail.
  return static_cast<const OwnClaim*>(
      hash_search(more_own_claims, &token, HASH_FIND, nullptr));  // pg: a lookup cannot raise
}

// The hash table goes with TopTransactionContext.
void forget_own_claims(XactEvent, void*) {
  own_claim_count = 0;
  more_own_claims = nullptr;
  more_own_claim_count = 0;
}

// A subtransaction rolled back takes its claims with it (and their rows' space may be
// reused or truncated away). Every claim made since it began has an id at least its own.
// pg-frame: a subtransaction callback, called by PostgreSQL (owns no C++ object).
void forget_rolled_back_claims(SubXactEvent event, SubTransactionId rolled_back, SubTransactionId,
                               void*) {
  if (event != SUBXACT_EVENT_ABORT_SUB) return;
  size_t kept = 0;
  for (size_t i = 0; i < own_claim_count; ++i)
    if (own_claims[i].subtransaction < rolled_back) own_claims[kept++] = own_claims[i];
  own_claim_count = kept;
  if (more_own_claims == nullptr) return;
  HASH_SEQ_STATUS scan;
  hash_seq_init(&scan, more_own_claims);
  while (auto* entry = static_cast<OwnClaim*>(hash_seq_search(&scan))) {
    if (entry->subtransaction < rolled_back) continue;
    (void)hash_search(more_own_claims, &entry->token, HASH_REMOVE, nullptr);
    --more_own_claim_count;
  }
}

// ---------------------------------------------------------------------------------------
// Results
// ---------------------------------------------------------------------------------------

enum class Status { kClaimed, kReclaimed, kReplay, kMismatch, kInProgress };
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
  pg_call([&] {
    for (int i = 0; i < 5; ++i) {
      loaded.oids[i] =
          GetSysCacheOid2(ENUMTYPOIDNAME, Anum_pg_enum_oid, ObjectIdGetDatum(status_type),
                          CStringGetDatum(kStatusLabels[i]));
      if (!OidIsValid(loaded.oids[i]))
        ereport(ERROR, (errcode(ERRCODE_UNDEFINED_OBJECT),
                        errmsg("claim_status has no label \"%s\"", kStatusLabels[i])));
    }
  });
  loaded.status_type = status_type;
  labels = loaded;
  return labels.oids;
}

// Returns the claim_result OID of this call, loading its status type when it changed.
Oid claim_result_type(FunctionCallInfo fcinfo) {
  Oid type = pg_call([&] {
    Oid t = get_fn_expr_rettype(fcinfo->flinfo);
    return OidIsValid(t) ? t : get_func_rettype(fcinfo->flinfo->fn_oid);
  });
  if (type == result_type.type) return type;
  Oid status_type = pg_call([&] {
    TupleDesc descriptor = lookup_rowtype_tupdesc(type, -1);
    Oid t = TupleDescAttr(descriptor, 0)->atttypid;
    ReleaseTupleDesc(descriptor);
    return t;
  });
  result_type = {type, status_type};
  return type;
}

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
};

constexpr int kResultFields = 12;

// Storage that the Datums of one result point to, for as long as they are used.
struct ResultStorage {
  pg_uuid_t token{};
  Interval retry_after{};
};

// The claim_result fields of `result` into values / nulls (kResultFields of each), with the
// labels of `status_type`.
void fill_result(const ClaimResult& result, Oid status_type, Datum* values, bool* nulls,
                 ResultStorage& storage) {
  const Oid* label = status_labels(status_type);
  for (int i = 0; i < kResultFields; ++i) nulls[i] = true;
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
}

Datum result_datum(FunctionCallInfo fcinfo, const ClaimResult& result) {
  Oid type = claim_result_type(fcinfo);
  Datum values[kResultFields];
  bool nulls[kResultFields];
  ResultStorage storage;
  fill_result(result, result_type.status_type, values, nulls, storage);
  // The type cache's descriptor of a named composite type needs no blessing.
  return pg_call([&] {
    TupleDesc descriptor = lookup_rowtype_tupdesc(type, -1);
    // A claim_result of an older version (before ALTER EXTENSION UPDATE) has fewer fields.
    if (descriptor->natts != kResultFields)
      ereport(ERROR,
              (errcode(ERRCODE_DATATYPE_MISMATCH),
               errmsg("claim_result has %d fields, not %d", descriptor->natts, kResultFields),
               errhint("Run ALTER EXTENSION idempotency UPDATE in this database.")));
    HeapTuple tuple = heap_form_tuple(descriptor, values, nulls);
    ReleaseTupleDesc(descriptor);
    return HeapTupleGetDatum(tuple);
  });
}

// What a duplicate may see of a stored row: the outcome, never the holder's token.
ClaimResult stored_answer(Status status, const KeyRow& row) {
  ClaimResult result(status);
  if (status == Status::kReplay) {
    result.response = row.response;
    result.response_code = row.response_code;
    result.response_body = row.response_body;
    result.response_headers = row.response_headers;
  }
  result.fingerprint = row.fingerprint;
  result.recovery_point = status == Status::kReplay ? row.recovery_point : nullptr;
  result.attempts = row.attempts;
  result.created_at = row.created_at;
  result.expires_at = row.expires_at;
  return result;
}

ClaimResult in_progress(int64 retry_after_us) {
  ClaimResult result(Status::kInProgress);
  result.retry_after_us = std::max<int64>(retry_after_us, 1000);
  stats::count(stats::kInProgress);
  return result;
}

// ---------------------------------------------------------------------------------------
// claim_key
// ---------------------------------------------------------------------------------------

bool same_bytes(const bytea* a, const bytea* b) {
  return VARSIZE_ANY_EXHDR(a) == VARSIZE_ANY_EXHDR(b) &&
         memcmp(VARDATA_ANY(a), VARDATA_ANY(b), VARSIZE_ANY_EXHDR(a)) == 0;
}

enum class Verdict { kAbsent, kExpired, kMismatch, kReplay, kLeased, kReclaimable };

// The SPEC's status table, applied to a row of the caller's (owner, scope, key) as read at
// `now`. Another role's row of the same (scope, key) is another key: never read here.
Verdict judge(const std::optional<KeyRow>& row, const bytea* fingerprint, TimestampTz now) {
  if (!row) return Verdict::kAbsent;
  if (row->expires_at <= now) return Verdict::kExpired;
  if (fingerprint != nullptr && row->fingerprint != nullptr &&
      !same_bytes(fingerprint, row->fingerprint))
    return Verdict::kMismatch;
  if (row->completed) return Verdict::kReplay;
  if (row->lease_token && row->locked_until && *row->locked_until > now) return Verdict::kLeased;
  return Verdict::kReclaimable;
}

struct ClaimRequest {
  explicit ClaimRequest(KeyName n) : name(n) {}
  KeyName name;
  bytea* fingerprint = nullptr;
  Interval ttl{};
  Interval lease{};
  TimestampTz deadline = 0;  // of waiting
  Caller caller{InvalidOid, nullptr};
  Oid table = InvalidOid;
};

key_store::ClaimValues claim_values(const ClaimRequest& request, TimestampTz now) {
  key_store::ClaimValues values{};
  values.owner = request.caller.name;
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
  remember_own_claim(values.token, values.ttl, where);
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

ClaimResult claim(Session& store, const ClaimRequest& request) {
  const KeyName& name = request.name;
  int retries_without_sleep = 0;
  // Waiting (wait > 0) sleeps until a transaction that wrote this key ends (key_wait.hpp).
  key_wait::Waiter waiter(name.wait_slot(request.caller.role),
                          request.deadline > GetCurrentTimestamp());
  for (bool first_look = true;; first_look = false) {
    waiter.prepare();  // before looking: a holder that ends after the look wakes us
    TimestampTz now = GetCurrentTimestamp();
    bool known_absent = false;
    // Every look is the dirty-snapshot look where the direct path may read: after waiting it
    // sees the holder's end, and a snapshot transaction gets 40001 instead of a stale row.
    std::optional<KeyRow> row =
        store.peek(request.caller.name, name.scope, name.key, &known_absent, !first_look);
    Verdict verdict = judge(row, request.fingerprint, now);
    switch (verdict) {
      case Verdict::kMismatch:
        stats::count(stats::kMismatched);
        return stored_answer(Status::kMismatch, *row);
      case Verdict::kReplay:
        stats::count(stats::kReplayed);
        return stored_answer(Status::kReplay, *row);
      case Verdict::kLeased:
        if (now >= request.deadline) return in_progress(*row->locked_until - now);
        waiter.sleep(request.deadline);
        continue;
      default:
        break;
    }

    key_lock::Outcome lock = key_lock::Outcome::kAlreadyHeld;  // none taken
    const key_lock::KeyIdentity identity = name.identity(request.table, request.caller.role);
    if (verdict == Verdict::kAbsent) {
      key_store::ClaimValues values = claim_values(request, now);
      key_store::RowAddress where{};
      Session::Insert inserted =
          store.insert_unlocked(name.scope, name.key, values, &where, known_absent);
      if (inserted == Session::Insert::kNeedsLock) {
        // Only the executor can write this table: its INSERT .. ON CONFLICT would wait on an
        // open inserter, so the key lock tells an open claim apart first.
        lock = key_lock::try_lock(identity);
        if (lock == key_lock::Outcome::kBusy)
          inserted = Session::Insert::kBusy;
        else
          inserted = store.insert(name.scope, name.key, values, &where) ? Session::Insert::kInserted
                                                                        : Session::Insert::kExists;
      }
      if (inserted == Session::Insert::kInserted)
        return claimed_answer(Status::kClaimed, values, where, 1, nullptr, now, request.fingerprint,
                              name.wait_slot(request.caller.role));
      if (inserted == Session::Insert::kBusy) {
        // A claim of this key is in a transaction that is still open.
        if (now >= request.deadline) return in_progress(USECS_PER_SEC);
        waiter.sleep(request.deadline);
        continue;
      }
      // A claim committed between our read and our insert; decide again from its row.
    } else if (std::optional<KeyRow> locked =
                   store.lock(request.caller.name, name.scope, name.key)) {
      // An existing row is taken over under its row lock (FOR UPDATE SKIP LOCKED): a
      // transaction that holds it makes us skip it, never wait, and no per-key lock is needed.
      Verdict current = judge(locked, request.fingerprint, now);
      if (current == Verdict::kExpired) {
        key_store::ClaimValues values = claim_values(request, now);
        store.restart(name.scope, name.key, values);
        return claimed_answer(Status::kClaimed, values, key_store::kNowhere, 1, nullptr, now,
                              request.fingerprint, name.wait_slot(request.caller.role));
      }
      if (current == Verdict::kReclaimable) {
        key_store::ClaimValues values = claim_values(request, now);
        KeyRow renewed = store.reclaim(name.scope, name.key, values);
        return claimed_answer(Status::kReclaimed, values, key_store::kNowhere, renewed.attempts,
                              renewed.recovery_point, renewed.created_at, renewed.fingerprint,
                              name.wait_slot(request.caller.role));
      }
      // The row changed since we read it: decide again.
    }
    // Else the row is gone (cleanup) or another transaction has it locked (a cleanup batch
    // or the old holder finishing): decide again, and wait if it persists.
    if (lock == key_lock::Outcome::kAcquired) key_lock::unlock(identity);
    if (++retries_without_sleep > 2) {
      if (now >= request.deadline) return in_progress(USECS_PER_SEC);
      waiter.sleep(request.deadline);
    }
  }
}

// Runs `work(store)` on the installation of the calling function, as its owner (caller.hpp).
template <typename Work>
auto as_owner(FunctionCallInfo fcinfo, Work&& work) {
  const caller::Installation installation = caller::of_function(fcinfo->flinfo->fn_oid);
  caller::ActingAsOwner acting(installation,
                               caller::ActingAsOwner::SearchPath::kBeforeFirstStatement);
  Session store(installation.table, acting);
  store.use_own_tokens([](const pg_uuid_t& token) { return own_claim(token) != nullptr; });
  auto result = work(static_cast<Session&>(store), installation);
  store.finish();
  return result;
}

Datum sql_claim_key(FunctionCallInfo fcinfo) {
  const Caller caller = calling("claim_key");
  ClaimRequest request(key_arguments(fcinfo, 0, 2));
  TimestampTz now = GetCurrentTimestamp();
  request.fingerprint = PG_ARGISNULL(1) ? nullptr : fingerprint_value(PG_GETARG_DATUM(1));
  request.ttl =
      bounded_interval_argument(fcinfo, 3, "ttl", gucs::default_ttl_seconds, gucs::max_ttl_seconds);
  request.lease = bounded_interval_argument(fcinfo, 4, "lease", gucs::default_lease_seconds,
                                            gucs::max_lease_seconds);
  request.deadline = now;
  if (!PG_ARGISNULL(5)) {
    Interval wait = as_span(*PG_GETARG_INTERVAL_P(5), "wait");
    if (wait.time < 0) throw Error(ERRCODE_INVALID_PARAMETER_VALUE, "wait must not be negative");
    request.deadline = add_interval(now, wait);
  }
  request.caller = caller;

  ClaimResult result = as_owner(fcinfo, [&](Session& store, const caller::Installation& at) {
    request.table = at.table;
    return claim(store, request);
  });
  return result_datum(fcinfo, result);
}

// ---------------------------------------------------------------------------------------
// complete_key, release_key, checkpoint_key: fenced by the token
// ---------------------------------------------------------------------------------------

[[noreturn]] void reject_missing(const KeyName& name) {
  throw Error(ERRCODE_NO_DATA_FOUND,
              "idempotency key " + name.describe() + " does not exist or has expired");
}

bool same_token(const std::optional<pg_uuid_t>& stored, const pg_uuid_t& token) {
  return stored && memcmp(stored->data, token.data, UUID_LEN) == 0;
}

// Explains why a fenced statement matched no row, by throwing; returns the row only when
// the key was completed with this very token (the caller decides whether that is a no-op).
KeyRow explain_fence(Session& store, const KeyName& name, const pg_uuid_t& token,
                     const Caller& caller, TimestampTz now) {
  std::optional<KeyRow> row = store.find(caller.name, name.scope, name.key);
  if (!row || row->expires_at <= now) reject_missing(name);
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

// Equal as jsonb, or both NULL.
bool same_jsonb(Jsonb* stored, Jsonb* given) {
  if ((stored == nullptr) != (given == nullptr)) return false;
  if (given == nullptr) return true;
  return pg_call([&] { return compareJsonbContainers(&stored->root, &given->root) == 0; });
}

// The same outcome: equal jsonb responses, codes and headers, and the same body bytes (an
// empty body is not no body).
bool same_response(const KeyRow& row, const key_store::Outcome& outcome) {
  if (row.response_code != outcome.response_code) return false;
  if ((row.response_body == nullptr) != (outcome.response_body == nullptr)) return false;
  if (outcome.response_body != nullptr && !same_bytes(row.response_body, outcome.response_body))
    return false;
  return same_jsonb(row.response, outcome.response) &&
         same_jsonb(row.response_headers, outcome.response_headers);
}

// Completes the claim `token` of `name` (complete_key and complete_keys): the stored row,
// or the row as it was when this very completion was made before (a no-op success).
KeyRow complete_one(Session& store, const KeyName& name, const pg_uuid_t& token,
                    const key_store::Outcome& outcome, const Caller& caller, TimestampTz now) {
  // The key expires ttl after its completion, in both patterns (SPEC §2): a completion in the
  // claiming transaction counts from now too, not from the claim, or a long transaction
  // would commit a key already expired and the redelivery would run the effect again.
  const OwnClaim* own = own_claim(token);
  std::optional<TimestampTz> expires_at;
  key_store::RowAddress where = key_store::kNowhere;
  if (own != nullptr) {
    expires_at = add_interval(now, own->ttl);
    where = own->where;
  } else {
    // A fresh snapshot, not the statement's: the claim may have been made earlier in this
    // very statement (claims of more keys than own_claims keeps), invisible to that snapshot.
    std::optional<KeyRow> row = store.find(caller.name, name.scope, name.key);
    if (!row || row->expires_at <= now) reject_missing(name);
    expires_at = add_interval(now, row->ttl);
  }
  std::optional<KeyRow> row =
      store.complete(name.scope, name.key, token, caller.name, outcome, now, *expires_at, where);
  if (row) {
    stats::count(stats::kCompleted);
    key_wait::touched(name.wait_slot(caller.role));
    return *row;
  }
  KeyRow stored = explain_fence(store, name, token, caller, now);
  if (!same_response(stored, outcome))
    throw Error(
        ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        "idempotency key " + name.describe() + " was already completed with another response");
  return stored;  // the same completion again: a no-op success
}

Datum sql_complete_key(FunctionCallInfo fcinfo) {
  const Caller caller = calling("complete_key");
  KeyName name = key_arguments(fcinfo, 0, 4);
  pg_uuid_t token = token_argument(fcinfo, 1);
  ResponseArguments given;
  if (!PG_ARGISNULL(2)) given.response = PG_GETARG_DATUM(2);
  if (!PG_ARGISNULL(3)) given.code = PG_GETARG_INT32(3);
  if (argument_given(fcinfo, 5)) given.body = PG_GETARG_DATUM(5);
  if (argument_given(fcinfo, 6)) given.headers = PG_GETARG_DATUM(6);
  const key_store::Outcome outcome = outcome_value(given);
  TimestampTz now = GetCurrentTimestamp();

  KeyRow completed = as_owner(fcinfo, [&](Session& store, const caller::Installation&) {
    return complete_one(store, name, token, outcome, caller, now);
  });
  return result_datum(fcinfo, stored_answer(Status::kReplay, completed));
}

Datum sql_release_key(FunctionCallInfo fcinfo) {
  const Caller caller = calling("release_key");
  KeyName name = key_arguments(fcinfo, 0, 2);
  pg_uuid_t token = token_argument(fcinfo, 1);
  TimestampTz now = GetCurrentTimestamp();
  (void)as_owner(fcinfo, [&](Session& store, const caller::Installation&) {
    if (!store.release(name.scope, name.key, token, caller.name, now)) {
      (void)explain_fence(store, name, token, caller, now);
      throw Error(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                  "idempotency key " + name.describe() + " is completed and cannot be released");
    }
    key_wait::touched(name.wait_slot(caller.role));
    return true;
  });
  stats::count(stats::kReleased);
  PG_RETURN_VOID();
}

Datum sql_checkpoint_key(FunctionCallInfo fcinfo) {
  const Caller caller = calling("checkpoint_key");
  KeyName name = key_arguments(fcinfo, 0, 3);
  pg_uuid_t token = token_argument(fcinfo, 1);
  text* recovery_point = reinterpret_cast<text*>(
      bounded_varlena_argument(fcinfo, 2, "recovery point", "idempotency.max_recovery_point_size",
                               gucs::max_recovery_point_size));
  TimestampTz now = GetCurrentTimestamp();
  // NULL keeps the lease the claim was made with (read below, from the caller's row).
  std::optional<Interval> lease;
  if (!PG_ARGISNULL(4))
    lease = bounded_interval_argument(fcinfo, 4, "lease", gucs::default_lease_seconds,
                                      gucs::max_lease_seconds);
  TimestampTz locked_until = as_owner(fcinfo, [&](Session& store, const caller::Installation&) {
    if (!lease) {
      std::optional<KeyRow> row = store.find(caller.name, name.scope, name.key);
      if (!row || row->expires_at <= now) reject_missing(name);
      lease = row->lease;
    }
    TimestampTz until = add_interval(now, *lease);
    if (!store.checkpoint(name.scope, name.key, token, caller.name, recovery_point, now, until)) {
      (void)explain_fence(store, name, token, caller, now);
      throw Error(
          ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
          "idempotency key " + name.describe() + " is completed; there is nothing to checkpoint");
    }
    return until;
  });
  PG_RETURN_TIMESTAMPTZ(locked_until);
}

// ---------------------------------------------------------------------------------------
// claim_keys, complete_keys: a batch in one call
//
// Each element is handled as the single-key function would handle it, in input order, in
// the caller's transaction, with the same validation, limits and SQLSTATEs; one row comes
// back per element, in input order, with its 1-based ordinality and its key. A batch never
// waits: a key held by an open transaction (another's, or an earlier element of this very
// batch) answers in_progress. So a key repeated in one batch is decided by its first
// occurrence, and every later occurrence gets what a duplicate gets at that moment:
// in_progress while the first occurrence's claim is open, replay / mismatch like the first
// when the key was completed. Any error (a bad element, a fenced completion) fails the
// whole call, which then changes nothing; its detail names the element.
// ---------------------------------------------------------------------------------------

// A one-dimensional array argument (array nullptr: the argument is NULL). Its elements are
// read in order by an ElementWalk, never copied out all at once: a batch of millions of keys
// costs no memory per element beyond the array PostgreSQL already holds.
struct ArrayArgument {
  ArrayType* array = nullptr;
  int count = 0;
};

ArrayArgument array_argument(FunctionCallInfo fcinfo, int n, Oid element_type, const char* name,
                             int expected_count) {
  ArrayArgument argument;
  if (PG_ARGISNULL(n)) return argument;
  ArrayType* array = pg_call([&] { return PG_GETARG_ARRAYTYPE_P(n); });
  if (ARR_NDIM(array) > 1)
    throw Error(ERRCODE_ARRAY_SUBSCRIPT_ERROR,
                std::string(name) + " must be a one-dimensional array",
                std::string(name) + " has " + std::to_string(ARR_NDIM(array)) + " dimensions.");
  if (ARR_ELEMTYPE(array) != element_type)
    throw Error(ERRCODE_DATATYPE_MISMATCH, std::string(name) + " is an array of another type");
  argument.array = array;
  argument.count = ARR_NDIM(array) == 0 ? 0 : ARR_DIMS(array)[0];
  if (expected_count >= 0 && argument.count != expected_count)
    throw Error(ERRCODE_ARRAY_SUBSCRIPT_ERROR, std::string(name) + " and keys differ in length",
                std::string(name) + " has " + std::to_string(argument.count) +
                    " elements; keys has " + std::to_string(expected_count) + ".",
                "Pass one element per key, or NULL for none.");
  return argument;
}

ArrayArgument keys_argument(FunctionCallInfo fcinfo) {
  if (PG_ARGISNULL(0))
    throw Error(ERRCODE_NULL_VALUE_NOT_ALLOWED, "keys must not be null", {},
                "Pass an array of keys; an empty array gives no rows.");
  return array_argument(fcinfo, 0, TEXTOID, "keys", -1);
}

// Walks the arrays of one batch in step, element by element (an absent array gives NULLs).
// Values point into the arrays. Trivially destructible: its iterators live in the current
// memory context.
class ElementWalk {
 public:
  static constexpr int kMaxArrays = 6;
  ElementWalk(std::initializer_list<const ArrayArgument*> arrays) {
    for (const ArrayArgument* argument : arrays) {
      ArrayType* array = argument->array;
      iterators_[count_++] =
          array == nullptr ? nullptr
                           : pg_call([&] { return array_create_iterator(array, 0, nullptr); });
    }
  }
  // Moves every array to its next element.
  void next() {
    for (int k = 0; k < count_; ++k) {
      nulls_[k] = true;
      if (iterators_[k] == nullptr) continue;
      ArrayIterator iterator = iterators_[k];
      Datum* value = &values_[k];
      bool* is_null = &nulls_[k];
      if (!pg_call([&] { return array_iterate(iterator, value, is_null); })) *is_null = true;
    }
  }
  Datum value(int k) const { return values_[k]; }
  bool is_null(int k) const { return nulls_[k]; }

 private:
  ArrayIterator iterators_[kMaxArrays] = {};
  Datum values_[kMaxArrays] = {};
  bool nulls_[kMaxArrays] = {};
  int count_ = 0;
};

// Runs `work` for the element at `ordinality`; an error says which element it was. Answers
// interrupts first: a batch of any size can be cancelled within an element's time.
template <typename Work>
auto for_element(int ordinality, Work&& work) {
  check_for_interrupts();
  try {
    return work();
  } catch (const Error& e) {
    const std::string where = "At element " + std::to_string(ordinality) + " of keys.";
    throw Error(e.sqlstate(), e.what(), e.detail().empty() ? where : e.detail() + " " + where,
                e.hint());
  }
}

// The rows of a batch function, in the tuplestore of materialize mode.
struct BatchOutput {
  Tuplestorestate* rows = nullptr;
  TupleDesc descriptor = nullptr;
  Oid status_type = InvalidOid;
};

BatchOutput begin_batch_output(FunctionCallInfo fcinfo) {
  BatchOutput output;
  pg_call([&] {
    InitMaterializedSRF(fcinfo, 0);
    auto* result_info = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);
    output.rows = result_info->setResult;
    output.descriptor = result_info->setDesc;
  });
  if (output.descriptor->natts != 2 + kResultFields ||
      TupleDescAttr(output.descriptor, 0)->atttypid != INT4OID ||
      TupleDescAttr(output.descriptor, 1)->atttypid != TEXTOID)
    throw Error(ERRCODE_DATATYPE_MISMATCH, "the batch function returns columns of unexpected types",
                {}, "Update the extension: ALTER EXTENSION idempotency UPDATE.");
  output.status_type = TupleDescAttr(output.descriptor, 2)->atttypid;
  return output;
}

void put_batch_row(const BatchOutput& output, int ordinality, Datum key,
                   const ClaimResult& result) {
  Datum values[2 + kResultFields];
  bool nulls[2 + kResultFields];
  values[0] = Int32GetDatum(ordinality);
  nulls[0] = false;
  values[1] = key;
  nulls[1] = false;
  ResultStorage storage;
  fill_result(result, output.status_type, values + 2, nulls + 2, storage);
  pg_call([&] { tuplestore_putvalues(output.rows, output.descriptor, values, nulls); });
}

// Checks every element with `check(walk, ordinality)` before any is acted on (a bad element
// fails the call, which then has changed nothing), then runs `work(store, at, walk,
// ordinality)` for each as the installation's owner. Each element runs in a memory context
// that is emptied after it, so a batch of any size runs in bounded memory.
template <typename Check, typename Work>
void for_each_element(FunctionCallInfo fcinfo, std::initializer_list<const ArrayArgument*> arrays,
                      int count, Check&& check, Work&& work) {
  MemoryContext function_context = CurrentMemoryContext;
  MemoryContext per_element = pg_call([&] {
    return AllocSetContextCreate(function_context, "idempotency batch element",
                                 ALLOCSET_DEFAULT_SIZES);
  });
  {
    ElementWalk walk(arrays);
    for (int i = 1; i <= count; ++i) {
      walk.next();
      MemoryContextSwitchTo(per_element);
      for_element(i, [&] { return check(walk, i); });
      MemoryContextSwitchTo(function_context);
      MemoryContextReset(per_element);  // pg: a reset does not raise
    }
  }
  BatchOutput output = begin_batch_output(fcinfo);
  ElementWalk walk(arrays);
  (void)as_owner(fcinfo, [&](Session& store, const caller::Installation& at) {
    for (int i = 1; i <= count; ++i) {
      walk.next();
      MemoryContextSwitchTo(per_element);
      store.use_context(per_element);
      put_batch_row(output, i, walk.value(0),
                    for_element(i, [&] { return work(store, at, walk); }));
      MemoryContextSwitchTo(function_context);
      MemoryContextReset(per_element);  // pg: a reset does not raise
    }
    return true;
  });
  MemoryContextSwitchTo(function_context);
}

// The key of the current element, checked (keys are the walk's first array).
KeyName element_name(const ElementWalk& walk, text* scope) {
  if (walk.is_null(0)) reject_null_key();
  text* key = pg_call([&] { return DatumGetTextPP(walk.value(0)); });
  return checked_name(scope, key);
}

Datum sql_claim_keys(FunctionCallInfo fcinfo) {
  const Caller caller = calling("claim_keys");
  const ArrayArgument keys = keys_argument(fcinfo);
  const ArrayArgument fingerprints =
      array_argument(fcinfo, 1, BYTEAOID, "fingerprints", keys.count);
  if (PG_ARGISNULL(2)) reject_null_scope();
  text* scope = text_argument(fcinfo, 2);
  ClaimRequest request(KeyName{scope, nullptr});
  request.ttl =
      bounded_interval_argument(fcinfo, 3, "ttl", gucs::default_ttl_seconds, gucs::max_ttl_seconds);
  request.lease = bounded_interval_argument(fcinfo, 4, "lease", gucs::default_lease_seconds,
                                            gucs::max_lease_seconds);
  request.caller = caller;
  // A batch never waits: its deadline has passed already.
  request.deadline = GetCurrentTimestamp();
  auto fingerprint_of = [](const ElementWalk& walk) {
    return walk.is_null(1) ? nullptr : fingerprint_value(walk.value(1));
  };
  for_each_element(
      fcinfo, {&keys, &fingerprints}, keys.count,
      [&](const ElementWalk& walk, int) {
        (void)element_name(walk, scope);
        (void)fingerprint_of(walk);
        return true;
      },
      [&](Session& store, const caller::Installation& at, const ElementWalk& walk) {
        request.name = element_name(walk, scope);
        request.fingerprint = fingerprint_of(walk);
        request.table = at.table;
        return claim(store, request);
      });
  return static_cast<Datum>(0);
}

Datum sql_complete_keys(FunctionCallInfo fcinfo) {
  const Caller caller = calling("complete_keys");
  const ArrayArgument keys = keys_argument(fcinfo);
  const ArrayArgument tokens = array_argument(fcinfo, 1, UUIDOID, "tokens", keys.count);
  if (tokens.array == nullptr)
    throw Error(ERRCODE_NULL_VALUE_NOT_ALLOWED, "tokens must not be null", {},
                "Pass the tokens that claim_keys returned, one per key.");
  const ArrayArgument responses = array_argument(fcinfo, 2, JSONBOID, "responses", keys.count);
  const ArrayArgument codes = array_argument(fcinfo, 3, INT4OID, "response_codes", keys.count);
  if (PG_ARGISNULL(4)) reject_null_scope();
  text* scope = text_argument(fcinfo, 4);
  const ArrayArgument bodies =
      argument_given(fcinfo, 5) ? array_argument(fcinfo, 5, BYTEAOID, "response_bodies", keys.count)
                                : ArrayArgument{};
  const ArrayArgument headers =
      argument_given(fcinfo, 6)
          ? array_argument(fcinfo, 6, JSONBOID, "response_headers", keys.count)
          : ArrayArgument{};
  const TimestampTz now = GetCurrentTimestamp();
  struct Completion {
    KeyName name;
    pg_uuid_t token;
    key_store::Outcome outcome;
  };
  auto completion_of = [&](const ElementWalk& walk) {
    Completion completion{element_name(walk, scope), {}, {}};
    if (walk.is_null(1))
      throw Error(ERRCODE_NULL_VALUE_NOT_ALLOWED, "token must not be null", {},
                  "Pass the token that claim_keys returned for this key.");
    completion.token = *DatumGetUUIDP(walk.value(1));
    ResponseArguments given;
    if (!walk.is_null(2)) given.response = walk.value(2);
    if (!walk.is_null(3)) given.code = DatumGetInt32(walk.value(3));
    if (!walk.is_null(4)) given.body = walk.value(4);
    if (!walk.is_null(5)) given.headers = walk.value(5);
    completion.outcome = outcome_value(given);
    return completion;
  };
  for_each_element(
      fcinfo, {&keys, &tokens, &responses, &codes, &bodies, &headers}, keys.count,
      [&](const ElementWalk& walk, int) {
        (void)completion_of(walk);
        return true;
      },
      [&](Session& store, const caller::Installation&, const ElementWalk& walk) {
        const Completion completion = completion_of(walk);
        KeyRow row =
            complete_one(store, completion.name, completion.token, completion.outcome, caller, now);
        return stored_answer(Status::kReplay, row);
      });
  return static_cast<Datum>(0);
}

// ALTER TYPE ... RENAME VALUE keeps a label's OID under a new name: look the labels up again.
void forget_result_type(Datum, SyscacheId, uint32) {
  result_type.type = InvalidOid;
  labels.status_type = InvalidOid;
}

}  // namespace

void on_load() {
  CacheRegisterSyscacheCallback(ENUMOID, forget_result_type, 0);
  RegisterXactCallback(forget_own_claims, nullptr);
  RegisterSubXactCallback(forget_rolled_back_claims, nullptr);
}

}  // namespace idem::claim_protocol

IDEM_SQL_FUNCTION(claim_key, idem::claim_protocol::sql_claim_key)
IDEM_SQL_FUNCTION(complete_key, idem::claim_protocol::sql_complete_key)
IDEM_SQL_FUNCTION(release_key, idem::claim_protocol::sql_release_key)
IDEM_SQL_FUNCTION(checkpoint_key, idem::claim_protocol::sql_checkpoint_key)
IDEM_SQL_FUNCTION(claim_keys, idem::claim_protocol::sql_claim_keys)
IDEM_SQL_FUNCTION(complete_keys, idem::claim_protocol::sql_complete_keys)
