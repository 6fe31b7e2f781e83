// PLACEHOLDER until issue 4 lands.
#include "pg_boundary.hpp"

namespace {
Datum sql_cleanup(FunctionCallInfo) {
  throw idem::Error(ERRCODE_FEATURE_NOT_SUPPORTED, "idempotency_cleanup is not built yet");
}
}  // namespace
IDEM_SQL_FUNCTION(idempotency_cleanup, sql_cleanup)
