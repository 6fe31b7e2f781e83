// The arguments of the SQL functions, read and checked: every bad value is refused with its
// documented SQLSTATE before anything is read from or written to the table.
#pragma once

#include "key_lock.hpp"
#include "key_wait.hpp"
#include "pg_boundary.hpp"

namespace idem::arguments {

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
  std::string describe() const;
};

// Who calls: the role (current_user) and its name, which is what the table stores as the
// key's owner (caller::name_of).
struct Caller {
  Oid role;
  text* name;
  int64 system = 0;  // the cluster's system identifier: with `role`, the stamp of its rows
};
// The calling role of the SQL function `function_name` (refused inside a
// security-restricted operation: caller.hpp).
Caller calling(const char* function_name);

text* text_argument(FunctionCallInfo fcinfo, int n);
[[noreturn]] void reject_null_key();
[[noreturn]] void reject_null_scope();
// A key and scope that are not NULL, checked against idempotency.max_key_length.
KeyName checked_name(text* scope, text* key);
// The key and scope arguments at `key_arg` and `scope_arg`, checked.
KeyName key_arguments(FunctionCallInfo fcinfo, int key_arg, int scope_arg);
// A token argument, which must not be NULL.
pg_uuid_t token_argument(FunctionCallInfo fcinfo, int n);

// An interval as one span of microseconds (a month counted as 30 days, a day as 24 hours);
// `name` names the argument in the out-of-range error.
Interval as_span(const Interval& interval, const char* name);
// `time` + `interval` (timestamptz_pl_interval; a span is added without the calendar).
TimestampTz add_interval(TimestampTz time, const Interval& interval);
// The optional ttl / lease argument `n`: positive and at most idempotency.max_ttl /
// max_lease; NULL takes idempotency.default_ttl / default_lease (held to the same maximum).
Interval ttl_argument(FunctionCallInfo fcinfo, int n);
Interval lease_argument(FunctionCallInfo fcinfo, int n);
// complete_key's optional response_ttl argument `n` (1.3): nullopt when NULL or not declared
// (the response lives as long as the key); else held to the rules of ttl (22023 when not
// positive, at most idempotency.max_ttl).
std::optional<Interval> response_ttl_argument(FunctionCallInfo fcinfo, int n);
// The end of waiting: `now` plus the optional wait argument `n` (NULL: no wait), refused
// when negative.
TimestampTz wait_deadline(FunctionCallInfo fcinfo, int n, TimestampTz now);

// A fingerprint (bytea) of at most idempotency.max_fingerprint_size bytes, measured before
// it is detoasted.
bytea* fingerprint_value(Datum raw);
// The optional recovery point argument `n` (nullptr when NULL), of at most
// idempotency.max_recovery_point_size bytes.
text* recovery_point_argument(FunctionCallInfo fcinfo, int n);

// An argument that may be left out: false when it is NULL, or when the function's SQL
// definition does not have it (the 1.1 definitions of complete_key / complete_keys, called
// through this library before ALTER EXTENSION UPDATE: reading past PG_NARGS() would read
// memory that holds no argument).
inline bool argument_given(FunctionCallInfo fcinfo, int n) {
  return n < PG_NARGS() && !PG_ARGISNULL(n);
}

}  // namespace idem::arguments
