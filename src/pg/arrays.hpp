// Arrays passed to SQL-callable functions, as C++ walks them. Every wrapper catches (pg_call).
#pragma once

#include "../pg_boundary.hpp"

namespace idem::pg::arrays {

// Argument `n` (not NULL) as an array, detoasted. Raises (out of memory, a toast read error).
// Allocates a detoasted copy in the current memory context.
inline ArrayType* argument(FunctionCallInfo fcinfo, int n) {
  return pg_call([&] { return PG_GETARG_ARRAYTYPE_P(n); });
}
// An iterator over every element of `array`. Raises (out of memory). Allocates it in the
// current memory context.
inline ArrayIterator iterate(ArrayType* array) {
  return pg_call([&] { return array_create_iterator(array, 0, nullptr); });
}
// The next element of `iterator` into `*value` / `*is_null`; false past the last. Raises not
// for a by-reference element (it points into the array); allocates nothing.
inline bool next(ArrayIterator iterator, Datum* value, bool* is_null) {
  return pg_call([&] { return array_iterate(iterator, value, is_null); });
}

}  // namespace idem::pg::arrays
