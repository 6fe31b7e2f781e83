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
// A numeric in its normalized text form (no trailing zeros). Raises (out of memory).
// Allocates the text in the current memory context.
inline const char* normalized_numeric(Numeric number) {
  return pg_call([&] { return static_cast<const char*>(numeric_normalize(number)); });
}

}  // namespace idem::pg::jsonb
