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
// The relation `name` in `schema`, InvalidOid when there is none. Raises (a syscache
// failure). Allocates nothing.
inline Oid relation_id(const char* name, Oid schema) {
  return pg_call([&] { return get_relname_relid(name, schema); });
}
// What `relation`'s valid indexes on `column` offer a scan by it: a B-Tree led by the column
// (an ordered walk), and the function of a BRIN whose one key is a call on the column that
// `is_key` accepts (given the index's expressions and the column's number; it runs inside
// this wrapper, so it may raise). Raises (a relation dropped meanwhile). Takes and releases
// AccessShareLock on it and its indexes; allocates the expressions read in the current memory
// context.
struct ColumnIndexes {
  bool btree_led = false;
  Oid brin_key_function = InvalidOid;
};
inline ColumnIndexes indexes_on(Oid relation, const char* column,
                                bool (*is_key)(const List*, AttrNumber)) {
  return pg_call([&] {
    ColumnIndexes found;
    Relation table = table_open(relation, AccessShareLock);
    const AttrNumber attnum = get_attnum(relation, column);
    List* indexes = RelationGetIndexList(table);
    ListCell* cell = nullptr;
    foreach (cell, indexes) {
      Relation index = index_open(lfirst_oid(cell), AccessShareLock);
      const Form_pg_index form = index->rd_index;
      found.btree_led =
          found.btree_led || (index->rd_rel->relam == BTREE_AM_OID && form->indisvalid &&
                              form->indnkeyatts >= 1 && form->indkey.values[0] == attnum);
      if (index->rd_rel->relam == BRIN_AM_OID && form->indisvalid && form->indnkeyatts == 1 &&
          form->indkey.values[0] == 0) {
        List* expressions = RelationGetIndexExpressions(index);
        if (is_key(expressions, attnum))
          found.brin_key_function = castNode(FuncExpr, linitial(expressions))->funcid;
      }
      index_close(index, AccessShareLock);
    }
    list_free(indexes);
    table_close(table, AccessShareLock);
    return found;
  });
}
// "schema"."function" of `function`, quoted for SQL text. Raises (a function dropped
// meanwhile). Allocates the string in the current memory context.
inline const char* qualified_function_name(Oid function) {
  return pg_call([&] {
    return static_cast<const char*>(quote_qualified_identifier(
        get_namespace_name(get_func_namespace(function)), get_func_name(function)));
  });
}
// The relation `name` in the schema of `beside` if a superuser owns it, else InvalidOid (also
// when there is none). Raises (a syscache failure). Allocates nothing.
inline Oid relation_owned_by_superuser(const char* name, Oid beside) {
  return pg_call([&] {
    Oid found = get_relname_relid(name, get_rel_namespace(beside));
    HeapTuple tuple =
        OidIsValid(found) ? SearchSysCache1(RELOID, ObjectIdGetDatum(found)) : nullptr;
    bool trusted = false;
    if (HeapTupleIsValid(tuple)) {
      trusted = superuser_arg(reinterpret_cast<Form_pg_class>(GETSTRUCT(tuple))->relowner);
      ReleaseSysCache(tuple);
    }
    return trusted ? found : InvalidOid;
  });
}
// Registers `callback` for invalidations of the syscache `cache`. Raises when too many
// callbacks are registered. Allocates nothing (a static array).
inline void on_syscache_change(int cache, SyscacheCallbackFunction callback) {
  pg_call([&] { CacheRegisterSyscacheCallback(cache, callback, 0); });
}

// Registers `callback` for relcache invalidations. Raises when too many callbacks are
// registered. Allocates nothing (a static array).
inline void on_relcache_change(RelcacheCallbackFunction callback) {
  pg_call([&] { CacheRegisterRelcacheCallback(callback, 0); });
}
// Processes the invalidation messages other sessions committed since this transaction last
// looked (a cheap test when there are none). Raises (a callback's error, out of memory).
inline void accept_invalidations() {
  pg_call([] { AcceptInvalidationMessages(); });
}
// The schema of the function `function`, InvalidOid when there is none. Raises (a syscache
// failure). Allocates nothing.
inline Oid function_schema(Oid function) {
  return pg_call([&] { return get_func_namespace(function); });
}
// The name of the function `function`, nullptr when there is none. Raises (a syscache
// failure). Allocates the name in the current memory context.
inline const char* function_name(Oid function) {
  return pg_call([&] { return static_cast<const char*>(get_func_name(function)); });
}
// The name of the schema `schema`, nullptr when there is none. Raises (a syscache failure).
// Allocates the name in the current memory context.
inline const char* schema_name(Oid schema) {
  return pg_call([&] { return static_cast<const char*>(get_namespace_name(schema)); });
}
// Does `role` have `privilege` (ACL_USAGE, ACL_CREATE) on `schema`, directly or through a
// membership? Raises (42704 for a schema dropped meanwhile, a syscache failure). Allocates
// nothing that outlives the call.
inline bool has_schema_privilege(Oid schema, Oid role, AclMode privilege) {
  return pg_call([&] { return object_acl(NamespaceRelationId, schema, role, privilege); }) ==
         ACLCHECK_OK;
}
// Does `role` have USAGE on `schema` (has_schema_privilege)?
inline bool has_schema_usage(Oid schema, Oid role) {
  return has_schema_privilege(schema, role, ACL_USAGE);
}
// Is the current user a superuser? Raises (a syscache failure). Allocates nothing.
inline bool current_user_is_superuser() {
  return pg_call([] { return superuser(); });
}
// The name of `role` as a text in `context`. Raises 42704 when there is no such role (a
// syscache failure, out of memory). Allocates the text in `context`.
inline text* role_name(Oid role, MemoryContext context) {
  return pg_call([&] {
    HeapTuple tuple = SearchSysCache1(AUTHOID, ObjectIdGetDatum(role));
    if (!HeapTupleIsValid(tuple))
      ereport(ERROR, (errcode(ERRCODE_UNDEFINED_OBJECT), errmsg("role %u does not exist", role)));
    MemoryContext old = MemoryContextSwitchTo(context);
    text* copy =
        cstring_to_text(NameStr(reinterpret_cast<Form_pg_authid>(GETSTRUCT(tuple))->rolname));
    MemoryContextSwitchTo(old);
    ReleaseSysCache(tuple);
    return copy;
  });
}

}  // namespace idem::pg::catalog
