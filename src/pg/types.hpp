// Types: enum labels, a function's result type, composite values. Every wrapper catches
// (pg_call).
#pragma once

#include "../pg_boundary.hpp"

namespace idem::pg::types {

// The OID of the label `label` of the enum `enum_type`, InvalidOid when it has none. Raises
// (a syscache failure). Allocates nothing.
inline Oid enum_label(Oid enum_type, const char* label) {
  return pg_call([&] {
    return GetSysCacheOid2(ENUMTYPOIDNAME, Anum_pg_enum_oid, ObjectIdGetDatum(enum_type),
                           CStringGetDatum(label));
  });
}
// The type the calling expression expects of this function (its declared result type when
// the call has no expression). Raises (a syscache failure). Allocates nothing.
inline Oid call_result_type(FunctionCallInfo fcinfo) {
  return pg_call([&] {
    const Oid type = get_fn_expr_rettype(fcinfo->flinfo);
    return OidIsValid(type) ? type : get_func_rettype(fcinfo->flinfo->fn_oid);
  });
}
// The type of field 0 of the composite type `type`. Raises (not a composite type). Allocates
// nothing (the type cache's descriptor is pinned and released).
inline Oid first_field_type(Oid type) {
  return pg_call([&] {
    TupleDesc descriptor = lookup_rowtype_tupdesc(type, -1);
    const Oid field = TupleDescAttr(descriptor, 0)->atttypid;
    ReleaseTupleDesc(descriptor);
    return field;
  });
}
// A value of the composite type `type` from `values` / `nulls`, which must have `fields`
// fields: raises 42804 otherwise, with `hint`. Raises (out of memory). Allocates the tuple in
// the current memory context.
inline Datum composite(Oid type, int fields, Datum* values, bool* nulls, const char* what,
                       const char* hint) {
  return pg_call([&] {
    TupleDesc descriptor = lookup_rowtype_tupdesc(type, -1);
    if (descriptor->natts != fields)
      ereport(ERROR, (errcode(ERRCODE_DATATYPE_MISMATCH),
                      errmsg("%s has %d fields, not %d", what, descriptor->natts, fields),
                      errhint("%s", hint)));
    HeapTuple tuple = heap_form_tuple(descriptor, values, nulls);
    ReleaseTupleDesc(descriptor);
    return HeapTupleGetDatum(tuple);
  });
}

// This call's result row from `values` / `nulls`, which must have `fields` fields: raises
// 42804 otherwise, naming `function` (declared with other columns than this library's).
// Raises (out of memory). Allocates the tuple in the current memory context.
inline Datum result_row(FunctionCallInfo fcinfo, int fields, Datum* values, bool* nulls,
                        const char* function) {
  return pg_call([&] {
    TupleDesc descriptor = nullptr;
    if (get_call_result_type(fcinfo, nullptr, &descriptor) != TYPEFUNC_COMPOSITE ||
        descriptor->natts != fields)
      ereport(ERROR, (errcode(ERRCODE_DATATYPE_MISMATCH),
                      errmsg("%s is declared with other columns than this library's", function)));
    return HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(descriptor), values, nulls));
  });
}

}  // namespace idem::pg::types
