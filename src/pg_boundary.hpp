// The C++ / PostgreSQL boundary.
//
// PostgreSQL reports errors with longjmp, which skips C++ destructors; a C++ exception
// that reaches a PostgreSQL frame terminates the backend. Every crossing therefore goes
// through the two functions here:
//   - sql_entry() wraps every SQL-callable function: C++ runs inside one try block, and a
//     failure is re-raised with ereport() only after the try block has been left;
//   - pg_call() wraps a call from C++ into PostgreSQL that may ereport(): the PostgreSQL
//     error is caught (PG_TRY), copied, and thrown again as a C++ PgError, so that the C++
//     frames in between unwind normally. sql_entry() re-raises it unchanged (same SQLSTATE).
#pragma once

#include "pg.hpp"

namespace idem {

// An error raised by our own code, with the SQLSTATE PostgreSQL will report.
class Error : public std::runtime_error {
 public:
  Error(int sqlstate, const std::string& message, std::string detail = {}, std::string hint = {})
      : std::runtime_error(message),
        sqlstate_(sqlstate),
        detail_(std::move(detail)),
        hint_(std::move(hint)) {}

  int sqlstate() const { return sqlstate_; }
  const std::string& detail() const { return detail_; }
  const std::string& hint() const { return hint_; }

 private:
  int sqlstate_;
  std::string detail_;
  std::string hint_;
};

// A PostgreSQL error caught while C++ frames were on the stack. It owns the copied
// ErrorData (palloc'd in the memory context that was current at the call) until
// sql_entry() re-raises it.
class PgError : public std::exception {
 public:
  explicit PgError(ErrorData* data) : data_(data) {}
  PgError(PgError&& other) noexcept : data_(std::exchange(other.data_, nullptr)) {}
  PgError(const PgError&) = delete;
  PgError& operator=(const PgError&) = delete;
  PgError& operator=(PgError&&) = delete;
  // An unreleased ErrorData stays in its memory context, which PostgreSQL resets.
  ~PgError() override = default;
  const char* what() const noexcept override;
  ErrorData* release() noexcept { return std::exchange(data_, nullptr); }

 private:
  ErrorData* data_;
};

namespace detail {
// Runs thunk(context) under PG_TRY; returns the copied error, or nullptr on success.
ErrorData* run_catching_pg_errors(void (*thunk)(void*), void* context);
// Leaves C++ for good: re-raises a caught PostgreSQL error, or reports a C++ failure.
[[noreturn]] void raise_error(ErrorData* pg_error);
// Records a C++ failure in static storage (no allocation: we may be out of memory).
void record_failure(int sqlstate, const char* message, const char* detail, const char* hint);
}  // namespace detail

// Calls a PostgreSQL function that may ereport(ERROR) and turns that error into PgError.
// The callable must own no C++ object with a destructor: a longjmp would skip it. A C++
// exception thrown inside it is caught there too and thrown again only once PG_TRY has been
// left through PG_END_TRY (leaving PG_TRY by a throw would leave PostgreSQL's error stack
// pointing at a dead frame, and the next ERROR would jump into it).
// Always inlined: the wrappers of src/pg/ are one pg_call each, and without it GCC kept a
// copy of pg_call per wrapper out of line, a call more per wrapper call (bench/run.sh
// instructions: inbox +0.15% over the same calls written inline before the layer).
template <typename Fn>
[[gnu::always_inline]] inline auto pg_call(Fn&& fn) {
  using Result = decltype(fn());
  struct Call {
    std::remove_reference_t<Fn>* fn;
    std::conditional_t<std::is_void_v<Result>, bool, Result> result;
    std::exception_ptr failure;
  } call{&fn, {}, nullptr};
  auto thunk = [](void* context) {
    auto* c = static_cast<Call*>(context);
    try {
      if constexpr (std::is_void_v<Result>)
        (*c->fn)();
      else
        c->result = (*c->fn)();
    } catch (...) {
      c->failure = std::current_exception();
    }
  };
  if (ErrorData* error = detail::run_catching_pg_errors(thunk, &call)) throw PgError(error);
  if (call.failure) std::rethrow_exception(call.failure);
  if constexpr (!std::is_void_v<Result>) return call.result;
}

// CHECK_FOR_INTERRUPTS() for C++ frames: a cancel or timeout arrives as a PgError, so the
// frames between here and sql_entry() unwind normally. Costs one load when nothing is pending.
inline void check_for_interrupts() {
  if (INTERRUPTS_PENDING_CONDITION()) pg_call([] { ProcessInterrupts(); });
}

// Runs the C++ body of an SQL-callable function. Nothing thrown escapes; the error is
// reported to PostgreSQL only once every C++ frame of the body has unwound.
template <typename Body>
Datum sql_entry(FunctionCallInfo fcinfo, Body&& body) noexcept {
  ErrorData* pg_error = nullptr;
  try {
    return body(fcinfo);
  } catch (PgError& e) {
    pg_error = e.release();
  } catch (const Error& e) {
    detail::record_failure(e.sqlstate(), e.what(), e.detail().c_str(), e.hint().c_str());
  } catch (const std::bad_alloc&) {
    detail::record_failure(ERRCODE_OUT_OF_MEMORY, "out of memory", nullptr, nullptr);
  } catch (const std::exception& e) {
    detail::record_failure(ERRCODE_INTERNAL_ERROR, e.what(), nullptr, nullptr);
  } catch (...) {
    detail::record_failure(ERRCODE_INTERNAL_ERROR, "unknown C++ exception", nullptr, nullptr);
  }
  detail::raise_error(pg_error);
}

}  // namespace idem

// Declares an SQL-callable function `name` whose body is the C++ function `impl`
// (Datum impl(FunctionCallInfo)), reached only through sql_entry().
#define IDEM_SQL_FUNCTION(name, impl)         \
  extern "C" {                                \
  PG_FUNCTION_INFO_V1(name);                  \
  Datum name(PG_FUNCTION_ARGS) {              \
    return ::idem::sql_entry(fcinfo, (impl)); \
  }                                           \
  }
