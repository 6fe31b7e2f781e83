// The response of a completion as the call passes it: the jsonb response and code, and the
// response as sent (body bytes, headers), checked against idempotency.max_response_size and
// the rules for header fields; and how two responses compare (a repeated completion).
#pragma once

#include "key_row.hpp"

namespace idem::responses {

// The parts of an outcome as the call passed them, not yet detoasted.
struct ResponseArguments {
  std::optional<Datum> response;  // jsonb
  std::optional<int32> code;
  std::optional<Datum> body;     // bytea
  std::optional<Datum> headers;  // jsonb
};

// The outcome of a completion. The response's parts together (the jsonb response, the body,
// the headers) are refused when over idempotency.max_response_size (54000), each measured
// before it is detoasted, so that an oversized value is never read; the headers are
// validated (22023).
key_store::Outcome outcome_value(const ResponseArguments& given);

// The same outcome as stored: equal jsonb responses, codes and headers, and the same body
// bytes (an empty body is not no body).
bool same_response(const key_store::KeyRow& row, const key_store::Outcome& outcome);

}  // namespace idem::responses
