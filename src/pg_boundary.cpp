// The C++ / PostgreSQL boundary: see pg_boundary.hpp for the rules it enforces.
#include "pg_boundary.hpp"

namespace idem {

const char* PgError::what() const noexcept {
  return (data_ != nullptr && data_->message != nullptr) ? data_->message : "PostgreSQL error";
}

namespace detail {

namespace {
// Static storage for a C++ failure on its way out: filling it cannot fail or allocate.
struct FailureRecord {
  int sqlstate;
  char message[1024];
  char detail[1024];
  char hint[512];
};
FailureRecord failure;

void copy_truncated(char* target, size_t size, const char* source) {
  target[0] = '\0';
  if (source == nullptr) return;
  strlcpy(target, source, size);
}
}  // namespace

void record_failure(int sqlstate, const char* message, const char* detail, const char* hint) {
  failure.sqlstate = sqlstate;
  copy_truncated(failure.message, sizeof failure.message, message);
  copy_truncated(failure.detail, sizeof failure.detail, detail);
  copy_truncated(failure.hint, sizeof failure.hint, hint);
}

// pg-frame: the boundary itself: no C++ object is alive here.
ErrorData* run_catching_pg_errors(void (*thunk)(void*), void* context) {
  MemoryContext caller_context = CurrentMemoryContext;
  ErrorData* volatile caught = nullptr;
  PG_TRY();
  { thunk(context); }
  PG_CATCH();
  {
    // CopyErrorData must not run in ErrorContext, which FlushErrorState resets.
    MemoryContextSwitchTo(caller_context);
    caught = CopyErrorData();
    FlushErrorState();
  }
  PG_END_TRY();
  return caught;
}

// pg-frame: the boundary itself: no C++ object is alive here.
void raise_error(ErrorData* pg_error) {
  if (pg_error != nullptr) ReThrowError(pg_error);
  ereport(ERROR, (errcode(failure.sqlstate), errmsg_internal("%s", failure.message),
                  failure.detail[0] ? errdetail_internal("%s", failure.detail) : 0,
                  failure.hint[0] ? errhint("%s", failure.hint) : 0));
  pg_unreachable();
}

}  // namespace detail
}  // namespace idem
