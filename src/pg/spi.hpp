// The executor's server programming interface (SPI), as C++ calls it. Every wrapper catches
// a PostgreSQL error (pg_call) and throws it as PgError; none leaves a C++ object behind.
#pragma once

#include "../pg_boundary.hpp"

namespace idem::pg::spi {

// Connects; keeps the caller's memory context current (SPI_connect would switch to SPI's
// procedure context). Raises. Allocates SPI's connection in the current transaction.
inline bool connect() {
  MemoryContext caller_context = CurrentMemoryContext;
  return pg_call([&] {
           const int result = SPI_connect();
           MemoryContextSwitchTo(caller_context);
           return result;
         }) == SPI_OK_CONNECT;
}
// Closes the connection and frees what it allocated. Raises.
inline void finish() {
  pg_call([] { SPI_finish(); });
}
// Prepares `sql` with `count` argument types as a generic plan and keeps it past the
// connection (TopMemoryContext), or nullptr when SPI_prepare_cursor fails (SPI_result tells
// why). Raises (a syntax or lookup error).
inline SPIPlanPtr prepare_kept(const char* sql, int count, Oid* types) {
  return pg_call([&] {
    SPIPlanPtr plan = SPI_prepare_cursor(sql, count, types, CURSOR_OPT_GENERIC_PLAN);
    if (plan != nullptr) SPI_keepplan(plan);
    return plan;
  });
}
// Frees a kept plan. Raises.
inline void free_plan(SPIPlanPtr plan) {
  pg_call([&] { SPI_freeplan(plan); });
}
// Frees the last statement's result (SPI_tuptable), if any. Raises.
inline void free_result() {
  if (SPI_tuptable != nullptr) pg_call([] { SPI_freetuptable(SPI_tuptable); });
}
// Runs a prepared plan; the result stays in SPI_tuptable (in SPI's procedure context) until
// free_result() or finish(). Keeps the caller's memory context current. Returns SPI's code
// (negative: an SPI failure). Raises whatever the statement raises.
inline int execute_plan(SPIPlanPtr plan, Datum* values, const char* nulls, bool read_only,
                        long limit) {
  MemoryContext caller_context = CurrentMemoryContext;
  return pg_call([&] {
    const int result = SPI_execute_plan(plan, values, nulls, read_only, limit);
    MemoryContextSwitchTo(caller_context);
    return result;
  });
}
// Runs the read-only query `sql` (connected) with `count` arguments of `types`, `values`
// (none NULL); the result stays in SPI_tuptable (in SPI's procedure context) until
// free_result() or finish(). Keeps the caller's memory context current. Returns SPI's code
// (negative: an SPI failure). Raises whatever the query raises.
inline int execute_read_only(const char* sql, int count, Oid* types, Datum* values) {
  MemoryContext caller_context = CurrentMemoryContext;
  return pg_call([&] {
    const int result = SPI_execute_with_args(sql, count, types, values, nullptr, true, 0);
    MemoryContextSwitchTo(caller_context);
    return result;
  });
}
// Runs the read-only query `sql` (connected) and adds its rows to this call's materialized
// result (srf::materialize). Raises 42804, naming `function`, when the query's columns are
// not of the result's declared types; raises whatever the query raises. Allocates the rows in
// the tuplestore's context, the query's result in SPI's (freed by finish()).
inline void rows_into_result(const char* sql, ReturnSetInfo* rsinfo, const char* function) {
  MemoryContext caller_context = CurrentMemoryContext;
  pg_call([&] {
    const int rc = SPI_execute(sql, true, 0);
    TupleDesc declared = rsinfo->setDesc;
    bool shaped = rc == SPI_OK_SELECT && SPI_tuptable->tupdesc->natts == declared->natts;
    for (int i = 0; shaped && i < declared->natts; ++i)
      shaped =
          TupleDescAttr(SPI_tuptable->tupdesc, i)->atttypid == TupleDescAttr(declared, i)->atttypid;
    if (!shaped)
      ereport(ERROR, (errcode(ERRCODE_DATATYPE_MISMATCH),
                      errmsg("%s is declared with other columns than this library's", function)));
    for (uint64 i = 0; i < SPI_processed; ++i)
      tuplestore_puttuple(rsinfo->setResult, SPI_tuptable->vals[i]);
    MemoryContextSwitchTo(caller_context);
  });
}
// Runs the read-only query `sql` (connected) with one text argument `argument` ($1) and
// returns its first row's first column, a text, copied into `context`: nullptr when there is
// no row (or the query's first column is not a text), "?" when the value is NULL. Raises
// `failure` (XX000) when the query is not a SELECT; raises whatever the query raises.
// Allocates the copy in `context`, the query's result in SPI's (freed by finish()).
inline const char* first_text(const char* sql, const char* argument, MemoryContext context,
                              const char* failure) {
  return pg_call([&] {
    const char* found = nullptr;
    Oid types[] = {TEXTOID};
    Datum values[] = {CStringGetTextDatum(argument)};
    const int rc = SPI_execute_with_args(sql, 1, types, values, nullptr, true, 1);
    if (rc != SPI_OK_SELECT) elog(ERROR, "%s", failure);
    if (SPI_processed > 0 && SPI_tuptable->tupdesc->natts == 1 &&
        TupleDescAttr(SPI_tuptable->tupdesc, 0)->atttypid == TEXTOID) {
      char* value = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
      found = value != nullptr ? MemoryContextStrdup(context, value) : "?";
    }
    return found;
  });
}
// Column `number` (1-based) of `tuple`, a row of the last result (of descriptor `desc`).
// Called without pg_call, once per column of a row: it raises only for a number out of range,
// which the caller excludes by checking the result's shape first (a pg_call per column would
// cost a setjmp each). Allocates nothing (a by-reference value points into the result).
// pg-frame: raises only on a column number the caller has checked.
inline Datum column_unchecked(HeapTuple tuple, TupleDesc desc, int number, bool* is_null) {
  return SPI_getbinval(tuple, desc, number, is_null);
}

}  // namespace idem::pg::spi
