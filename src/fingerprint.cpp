// request_fingerprint(): SHA-256 of a request payload.
//
// For jsonb the digest is taken over a canonical stream, so that values equal as jsonb
// give equal fingerprints: jsonb already stores object keys sorted and de-duplicated, and
// numbers are written in their normalized form (1.0 and 1.00 are equal jsonb values but
// have different binary forms). Every token is tagged and length-prefixed, so no two
// different documents can produce the same stream.
#include "pg_boundary.hpp"
#include "sha256.hpp"
#include "pg/fmgr.hpp"
#include "pg/jsonb.hpp"

namespace idem::fingerprint {
namespace {

void hash_scalar(Sha256& sha, const JsonbValue& value) {
  switch (value.type) {
    case jbvNull:
      sha.token('n', nullptr, 0);
      break;
    case jbvBool:
      sha.token(value.val.boolean ? 't' : 'f', nullptr, 0);
      break;
    case jbvString:
      sha.token('s', value.val.string.val, static_cast<uint32_t>(value.val.string.len));
      break;
    case jbvNumeric: {
      const char* text = pg::jsonb::normalized_numeric(value.val.numeric);
      sha.token('#', text, static_cast<uint32_t>(strlen(text)));
      break;
    }
    default:
      throw Error(ERRCODE_INTERNAL_ERROR, "unexpected jsonb scalar type");
  }
}

bytea* of_jsonb(Jsonb* document) {
  Sha256 sha;
  JsonbIterator* it = pg::jsonb::iterate(&document->root);
  JsonbValue value;
  JsonbIteratorToken token;
  while ((token = pg::jsonb::next(&it, &value)) != WJB_DONE) {
    switch (token) {
      case WJB_BEGIN_ARRAY:
        // A raw scalar is stored as a one-element pseudo array; keep it apart from [x].
        sha.token(value.val.array.rawScalar ? 'r' : '[', nullptr, 0);
        break;
      case WJB_END_ARRAY:
        sha.token(']', nullptr, 0);
        break;
      case WJB_BEGIN_OBJECT:
        sha.token('{', nullptr, 0);
        break;
      case WJB_END_OBJECT:
        sha.token('}', nullptr, 0);
        break;
      case WJB_KEY:
        sha.token('k', value.val.string.val, static_cast<uint32_t>(value.val.string.len));
        break;
      case WJB_VALUE:
      case WJB_ELEM:
        hash_scalar(sha, value);
        break;
      default:
        throw Error(ERRCODE_INTERNAL_ERROR, "unexpected jsonb token");
    }
  }
  return sha.finish();
}

bytea* of_bytes(const char* data, size_t length) {
  Sha256 sha;
  sha.update(data, length);
  return sha.finish();
}

Datum sql_fingerprint_jsonb(FunctionCallInfo fcinfo) {
  Jsonb* document = pg::fmgr::jsonb_argument(fcinfo);
  PG_RETURN_BYTEA_P(of_jsonb(document));
}

// text and bytea share one body: both are varlenas whose bytes are hashed as they are.
Datum sql_fingerprint_bytes(FunctionCallInfo fcinfo) {
  struct varlena* data = pg::fmgr::detoast_packed(PG_GETARG_DATUM(0));
  PG_RETURN_BYTEA_P(of_bytes(VARDATA_ANY(data), VARSIZE_ANY_EXHDR(data)));
}

}  // namespace
}  // namespace idem::fingerprint

IDEM_SQL_FUNCTION(request_fingerprint_jsonb, idem::fingerprint::sql_fingerprint_jsonb)
IDEM_SQL_FUNCTION(request_fingerprint_bytes, idem::fingerprint::sql_fingerprint_bytes)
