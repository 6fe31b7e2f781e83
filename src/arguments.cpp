// The arguments of the SQL functions, read and checked (arguments.hpp).
#include "arguments.hpp"

#include "caller.hpp"
#include "gucs.hpp"
#include "pg/fmgr.hpp"

namespace idem::arguments {

std::string KeyName::describe() const {
  std::string name(key_bytes(), key_length());
  if (scope_length() == 0) return "\"" + name + "\"";
  return "\"" + name + "\" in scope \"" + std::string(scope_bytes(), scope_length()) + "\"";
}

Caller calling(const char* function_name) {
  const Oid role = caller::calling_role(function_name);
  return {role, caller::name_of(role), caller::system_identifier()};
}

text* text_argument(FunctionCallInfo fcinfo, int n) {
  return pg::fmgr::text_argument(fcinfo, n);
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

namespace {

Interval seconds_interval(int seconds) {
  Interval interval{};
  interval.time = int64{seconds} * USECS_PER_SEC;
  return interval;
}

// An optional interval argument (ttl, lease) that must be positive and at most
// idempotency.max_<name>; NULL takes idempotency.default_<name>, held to the same maximum
// (a superuser may set the two apart).
// setting_stem names the settings that bound the argument: idempotency.default_<stem> and
// idempotency.max_<stem> (a response_ttl is bounded by the ttl's).
Interval bounded_interval_argument(FunctionCallInfo fcinfo, int n, const char* name,
                                   const char* setting_stem, int default_seconds, int max_seconds) {
  // The setting names only go into a message: built on the way to an error, never on the
  // way to an answer (a replay pays for no string).
  auto setting = [setting_stem] { return std::string("idempotency.default_") + setting_stem; };
  auto limit = [setting_stem] { return std::string("idempotency.max_") + setting_stem; };
  if (PG_ARGISNULL(n)) {
    if (default_seconds > max_seconds)
      throw Error(ERRCODE_INVALID_PARAMETER_VALUE, setting() + " exceeds " + limit(),
                  setting() + " is " + std::to_string(default_seconds) + " s; " + limit() + " is " +
                      std::to_string(max_seconds) + " s.");
    return seconds_interval(default_seconds);
  }
  Interval interval = as_span(*PG_GETARG_INTERVAL_P(n), name);
  if (interval.time <= 0)
    throw Error(ERRCODE_INVALID_PARAMETER_VALUE, std::string(name) + " must be positive",
                "Pass NULL to use " + setting() + ".");
  if (interval.time > int64{max_seconds} * USECS_PER_SEC)
    throw Error(ERRCODE_INVALID_PARAMETER_VALUE, std::string(name) + " exceeds " + limit(),
                limit() + " is " + std::to_string(max_seconds) + " s.");
  return interval;
}

// An optional bytea or text argument of at most `limit` bytes (the fingerprint, the recovery
// point), measured before it is detoasted: an oversized value is refused without being read.
struct varlena* bounded_varlena(Datum raw, const char* name, const char* setting, int limit) {
  size_t size = pg::fmgr::raw_size(raw) - VARHDRSZ;
  if (size > static_cast<size_t>(limit))
    throw Error(ERRCODE_STRING_DATA_RIGHT_TRUNCATION, std::string(name) + " is too long",
                "The " + std::string(name) + " has " + std::to_string(size) + " bytes; " + setting +
                    " is " + std::to_string(limit) + ".");
  return pg::fmgr::detoast_packed(raw);
}

struct varlena* bounded_varlena_argument(FunctionCallInfo fcinfo, int n, const char* name,
                                         const char* setting, int limit) {
  if (PG_ARGISNULL(n)) return nullptr;
  return bounded_varlena(PG_GETARG_DATUM(n), name, setting, limit);
}

}  // namespace

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
  // A span (as_span: microseconds only, as every ttl, lease and wait is) needs no calendar:
  // a checked addition, without a function call per claim. Anything else, and a sum out of
  // range, goes to timestamptz_pl_interval, which raises as PostgreSQL does.
  int64 sum = 0;
  if (interval.month == 0 && interval.day == 0 && !TIMESTAMP_NOT_FINITE(time) &&
      !pg_add_s64_overflow(time, interval.time, &sum) && IS_VALID_TIMESTAMP(sum))
    return sum;
  return pg::fmgr::plus_interval(time, interval);
}

Interval ttl_argument(FunctionCallInfo fcinfo, int n) {
  return bounded_interval_argument(fcinfo, n, "ttl", "ttl", gucs::default_ttl_seconds,
                                   gucs::max_ttl_seconds);
}

std::optional<Interval> response_ttl_argument(FunctionCallInfo fcinfo, int n) {
  if (!argument_given(fcinfo, n)) return std::nullopt;
  return bounded_interval_argument(fcinfo, n, "response_ttl", "ttl", gucs::default_ttl_seconds,
                                   gucs::max_ttl_seconds);
}

Interval lease_argument(FunctionCallInfo fcinfo, int n) {
  return bounded_interval_argument(fcinfo, n, "lease", "lease", gucs::default_lease_seconds,
                                   gucs::max_lease_seconds);
}

TimestampTz wait_deadline(FunctionCallInfo fcinfo, int n, TimestampTz now) {
  if (PG_ARGISNULL(n)) return now;
  const Interval wait = as_span(*PG_GETARG_INTERVAL_P(n), "wait");
  if (wait.time < 0) throw Error(ERRCODE_INVALID_PARAMETER_VALUE, "wait must not be negative");
  return add_interval(now, wait);
}

bytea* fingerprint_value(Datum raw) {
  return reinterpret_cast<bytea*>(bounded_varlena(
      raw, "fingerprint", "idempotency.max_fingerprint_size", gucs::max_fingerprint_size));
}

text* recovery_point_argument(FunctionCallInfo fcinfo, int n) {
  return reinterpret_cast<text*>(bounded_varlena_argument(fcinfo, n, "recovery point",
                                                          "idempotency.max_recovery_point_size",
                                                          gucs::max_recovery_point_size));
}

}  // namespace idem::arguments
