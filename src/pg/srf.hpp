// Set-returning SQL functions: the materialized result and its rows. Every wrapper catches
// (pg_call).
#pragma once

#include "../pg_boundary.hpp"

namespace idem::pg::srf {

// Sets up this call's result as a tuplestore of the declared row type (rsinfo->setResult,
// rsinfo->setDesc). Raises (not called in a context that accepts a set, out of memory).
// Allocates both in the query's per-query memory context.
inline void materialize(FunctionCallInfo fcinfo) {
  pg_call([&] { InitMaterializedSRF(fcinfo, 0); });
}
// Adds the row `values` / `nulls` to the tuplestore `rows` of row type `descriptor`. Raises
// (out of memory, a temporary file error). Allocates the row in the tuplestore's context.
inline void put_row(Tuplestorestate* rows, TupleDesc descriptor, Datum* values, bool* nulls) {
  pg_call([&] { tuplestore_putvalues(rows, descriptor, values, nulls); });
}
// A text value of `string`. Raises (out of memory). Allocates it in the current memory
// context.
inline Datum text_value(const char* string) {
  return pg_call([&] { return CStringGetTextDatum(string); });
}
// Adds the row `values` / `nulls` to the result. Raises (out of memory, a temporary file
// error). Allocates the row in the tuplestore's memory context.
inline void put_row(ReturnSetInfo* rsinfo, Datum* values, bool* nulls) {
  pg_call([&] { tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls); });
}

}  // namespace idem::pg::srf
