// The response of a completion, read and checked; responses compared (responses.hpp).
#include "responses.hpp"

#include "gucs.hpp"
#include "pg/errors.hpp"
#include "pg/fmgr.hpp"
#include "pg/jsonb.hpp"

namespace idem::responses {
namespace {

// Why response headers are refused.
enum class HeadersProblem { kNone, kNotObject, kName, kValue, kElement, kControl };
// What check_headers found. `name` points into the headers' jsonb.
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
// (the iterators) in the current memory context.
HeadersCheck check_headers(Jsonb* headers) {
  HeadersCheck check;
  if (!JB_ROOT_IS_OBJECT(headers)) {
    check.problem = HeadersProblem::kNotObject;
    JsonbValue scalar;
    check.kind = JB_ROOT_IS_SCALAR(headers) && pg::jsonb::scalar(&headers->root, &scalar)
                     ? kind_of(scalar)
                     : "an array";
    return check;
  }
  JsonbIterator* fields = pg::jsonb::iterate(&headers->root);
  JsonbValue value;
  for (JsonbIteratorToken token;
       (token = pg::jsonb::next_skipping_nested(&fields, &value)) != WJB_DONE;) {
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
      JsonbIterator* elements = pg::jsonb::iterate(value.val.binary.data);
      JsonbValue element;
      for (JsonbIteratorToken e;
           (e = pg::jsonb::next_skipping_nested(&elements, &element)) != WJB_DONE;) {
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
  const int length = pg::errors::clipped_length(check.name, check.name_length, 64);
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
  const HeadersCheck check = check_headers(headers);
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

// Equal as jsonb, or both NULL.
bool same_jsonb(Jsonb* stored, Jsonb* given) {
  if ((stored == nullptr) != (given == nullptr)) return false;
  if (given == nullptr) return true;
  return pg::jsonb::equal(&stored->root, &given->root);
}

}  // namespace

bool same_response(const key_store::KeyRow& row, const key_store::Outcome& outcome) {
  if (row.response_code != outcome.response_code) return false;
  if ((row.response_body == nullptr) != (outcome.response_body == nullptr)) return false;
  if (outcome.response_body != nullptr &&
      !key_store::same_bytes(row.response_body, outcome.response_body))
    return false;
  return same_jsonb(row.response, outcome.response) &&
         same_jsonb(row.response_headers, outcome.response_headers);
}

key_store::Outcome outcome_value(const ResponseArguments& given) {
  const auto size_of = [](const std::optional<Datum>& value) -> size_t {
    if (!value) return 0;
    return pg::fmgr::raw_size(*value);
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
  if (given.response) outcome.response = pg::fmgr::jsonb_value(*given.response);
  if (given.body)
    outcome.response_body = reinterpret_cast<bytea*>(pg::fmgr::detoast_packed(*given.body));
  if (given.headers) {
    outcome.response_headers = pg::fmgr::jsonb_value(*given.headers);
    validate_headers(outcome.response_headers);
  }
  return outcome;
}

}  // namespace idem::responses
