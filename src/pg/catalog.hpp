// Catalog lookups, as C++ makes them. Every wrapper catches (pg_call).
#pragma once

#include "../pg_boundary.hpp"

namespace idem::pg::catalog {

// "schema"."relation" of `relation`, quoted for SQL text. Raises (a relation dropped
// meanwhile, out of memory). Allocates the string in the current memory context.
inline const char* qualified_relation_name(Oid relation) {
  return pg_call([&] {
    return static_cast<const char*>(quote_qualified_identifier(
        get_namespace_name(get_rel_namespace(relation)), get_rel_name(relation)));
  });
}
// The type of column `column` of `relation`, InvalidOid when there is none. Raises (a
// syscache failure). Allocates nothing.
inline Oid column_type(Oid relation, const char* column) {
  return pg_call([&] {
    const AttrNumber number = get_attnum(relation, column);
    return number == InvalidAttrNumber ? InvalidOid : get_atttype(relation, number);
  });
}
// Does `relation` have a column `column`? Raises (a syscache failure). Allocates nothing.
inline bool has_column(Oid relation, const char* column) {
  return pg_call([&] { return get_attnum(relation, column) != InvalidAttrNumber; });
}
// Registers `callback` for invalidations of the syscache `cache`. Raises when too many
// callbacks are registered. Allocates nothing (a static array).
inline void on_syscache_change(int cache, SyscacheCallbackFunction callback) {
  pg_call([&] { CacheRegisterSyscacheCallback(cache, callback, 0); });
}

}  // namespace idem::pg::catalog
