// Arguments of SQL-callable functions and values passed by the function manager, as C++
// reads them. Every wrapper catches (pg_call).
#pragma once

#include "../pg_boundary.hpp"

namespace idem::pg::fmgr {

// Argument `n` (not NULL) as text, detoasted if it was toasted or compressed (short headers
// kept). Raises (out of memory, a toast read error). Allocates a detoasted copy in the current
// memory context.
inline text* text_argument(FunctionCallInfo fcinfo, int n) {
  return pg_call([&] { return PG_GETARG_TEXT_PP(n); });
}
// `value` (a text) detoasted, short headers kept. Raises (out of memory, a toast read
// error). Allocates a detoasted copy in the current memory context.
inline text* text_value(Datum value) {
  return pg_call([&] { return DatumGetTextPP(value); });
}
// Argument 0 (not NULL) as jsonb, detoasted. Raises (out of memory, a toast read error).
// Allocates a detoasted copy in the current memory context.
inline Jsonb* jsonb_argument(FunctionCallInfo fcinfo) {
  return pg_call([&] { return PG_GETARG_JSONB_P(0); });
}
// `value` (a jsonb) detoasted. Raises (out of memory, a toast read error). Allocates a
// detoasted copy in the current memory context.
inline Jsonb* jsonb_value(Datum value) {
  return pg_call([&] { return DatumGetJsonbP(value); });
}
// The size of `value` once detoasted, header included, without detoasting it. Raises (a toast
// read error). Allocates nothing.
inline size_t raw_size(Datum value) {
  return pg_call([&] { return toast_raw_datum_size(value); });
}
// `value` detoasted, short headers kept. Raises (out of memory, a toast read error).
// Allocates a detoasted copy in the current memory context.
inline struct varlena* detoast_packed(Datum value) {
  return pg_call([&] { return PG_DETOAST_DATUM_PACKED(value); });
}
// `time` + `interval` as timestamptz + interval computes it. Raises 22008 (out of range).
// Allocates nothing.
inline TimestampTz plus_interval(TimestampTz time, const Interval& interval) {
  return pg_call([&] {
    return DatumGetTimestampTz(DirectFunctionCall2(
        timestamptz_pl_interval, TimestampTzGetDatum(time), IntervalPGetDatum(&interval)));
  });
}

// The storage files' wrappers (key_row.hpp, key_heap*.cpp).
// `value` detoasted into a copy of its own in `context` (a varlena read from a row, kept past
// the scan). Raises (out of memory, a toast read error). Allocates the copy in `context`.
inline struct varlena* detoast_copy(Datum value, MemoryContext context) {
  return pg_call([&] {
    MemoryContext old = MemoryContextSwitchTo(context);
    struct varlena* copy = PG_DETOAST_DATUM_COPY(value);
    MemoryContextSwitchTo(old);
    return copy;
  });
}

}  // namespace idem::pg::fmgr
