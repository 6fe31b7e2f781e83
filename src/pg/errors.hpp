// PostgreSQL errors raised on purpose from C++, and the formatting of values for messages.
// Every wrapper catches (pg_call): the error arrives as PgError.
#pragma once

#include "../pg_boundary.hpp"

namespace idem::pg::errors {

// As INSERT .. ON CONFLICT does: a transaction that reads with one snapshot (REPEATABLE READ,
// SERIALIZABLE) cannot decide from a version of the key committed after that snapshot. Both
// paths raise it where they find such a version.
// pg-frame: raises 40001; called inside pg_call (the direct path's reads and writes).
inline void raise_committed_after_snapshot(text* key) {
  ereport(ERROR, (errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
                  errmsg("could not serialize access due to concurrent update"),
                  errdetail("Idempotency key \"%s\" was written by a transaction that "
                            "committed after this transaction's snapshot.",
                            text_to_cstring(key))));
}
// Raises 40001 for a key written by a transaction that committed after this transaction's
// snapshot (raise_committed_after_snapshot), as PgError. Always throws.
[[noreturn]] inline void committed_after_snapshot(text* key) {
  pg_call([&] { raise_committed_after_snapshot(key); });
  throw Error(ERRCODE_INTERNAL_ERROR, "raise_committed_after_snapshot returned");
}
// `time` as timestamptz_to_str writes it (DateStyle, TimeZone). Raises not. Returns a
// static buffer, overwritten by the next call.
inline const char* timestamp_text(TimestampTz time) {
  return pg_call([&] { return timestamptz_to_str(time); });
}

// How many bytes of the `length` bytes at `string` (in the database encoding) fit in `limit`
// bytes without cutting a character. Raises (an invalid multibyte sequence). Allocates
// nothing.
inline int clipped_length(const char* string, int length, int limit) {
  return pg_call([&] { return pg_mbcliplen(string, length, limit); });
}

// Reports `message` at `level` (LOG, DEBUG1, ...: never ERROR or above) to the server log.
// Raises (out of memory). Allocates in ErrorContext, which the report empties.
inline void report(int level, const char* message) {
  pg_call([&] { ereport(level, (errmsg_internal("%s", message))); });
}
// Reports the caught `error` at LOG, to the server log only, its message prefixed with
// `prefix` and ": ", keeping its SQLSTATE, detail and hint. Raises (out of memory). Allocates
// the new message in the current memory context.
inline void report_at_log(ErrorData* error, const char* prefix) {
  error->elevel = LOG;
  error->output_to_client = false;
  pg_call([&] {
    error->message = psprintf("%s: %s", prefix, error->message != nullptr ? error->message : "?");
    ThrowErrorData(error);
  });
}

}  // namespace idem::pg::errors
