// Walking a jsonb document, as C++ hashes one. Every wrapper catches (pg_call).
#pragma once

#include "../pg_boundary.hpp"

namespace idem::pg::jsonb {

// An iterator over `container`. Raises (out of memory). Allocates the iterator in the current
// memory context; iterating to WJB_DONE frees it.
inline JsonbIterator* iterate(JsonbContainer* container) {
  return pg_call([&] { return JsonbIteratorInit(container); });
}
// The next token of `*iterator`, its value in `*value`. Raises (out of memory, a corrupt
// document). Allocates nested iterators in the current memory context.
inline JsonbIteratorToken next(JsonbIterator** iterator, JsonbValue* value) {
  return pg_call([&] { return JsonbIteratorNext(iterator, value, false); });
}
// The next token of `*iterator` at this level (nested containers come back whole, as
// jbvBinary), its value in `*value`. Raises (out of memory, a corrupt document). Allocates
// iterators in the current memory context.
inline JsonbIteratorToken next_skipping_nested(JsonbIterator** iterator, JsonbValue* value) {
  return pg_call([&] { return JsonbIteratorNext(iterator, value, true); });
}
// The scalar of a scalar document `container` into `*value`; false when it is not one.
// Raises (out of memory). Allocates an iterator in the current memory context.
inline bool scalar(JsonbContainer* container, JsonbValue* value) {
  return pg_call([&] { return JsonbExtractScalar(container, value); });
}
// Are `a` and `b` equal as jsonb? Raises (out of memory, a corrupt document). Allocates
// iterators in the current memory context.
inline bool equal(JsonbContainer* a, JsonbContainer* b) {
  return pg_call([&] { return compareJsonbContainers(a, b) == 0; });
}
// A numeric in its normalized text form (no trailing zeros). Raises (out of memory).
// Allocates the text in the current memory context.
inline const char* normalized_numeric(Numeric number) {
  return pg_call([&] { return static_cast<const char*>(numeric_normalize(number)); });
}

}  // namespace idem::pg::jsonb
