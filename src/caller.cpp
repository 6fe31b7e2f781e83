// Who calls, and the switch to the extension owner (see caller.hpp).
#include "caller.hpp"

#include "pg_boundary.hpp"

namespace idem::caller {
namespace {

constexpr const char* kTableName = "idempotency_keys";

// What the catalogs say about a schema and the table in it, read in one pg_call.
struct Found {
  bool schema_exists = false;
  Oid schema_owner = InvalidOid;
  bool schema_owner_is_superuser = false;
  Oid table = InvalidOid;
  char table_kind = 0;
  Oid table_owner = InvalidOid;
  bool table_owner_is_superuser = false;
};

Found look_up(Oid schema) {
  return pg_call([&] {
    Found found;
    HeapTuple tuple = SearchSysCache1(NAMESPACEOID, ObjectIdGetDatum(schema));
    if (!HeapTupleIsValid(tuple)) return found;
    found.schema_exists = true;
    found.schema_owner = reinterpret_cast<Form_pg_namespace>(GETSTRUCT(tuple))->nspowner;
    ReleaseSysCache(tuple);
    found.schema_owner_is_superuser = superuser_arg(found.schema_owner);
    found.table = get_relname_relid(kTableName, schema);
    if (!OidIsValid(found.table)) return found;
    tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(found.table));
    if (!HeapTupleIsValid(tuple)) {
      found.table = InvalidOid;
      return found;
    }
    auto* form = reinterpret_cast<Form_pg_class>(GETSTRUCT(tuple));
    found.table_kind = form->relkind;
    found.table_owner = form->relowner;
    ReleaseSysCache(tuple);
    found.table_owner_is_superuser = superuser_arg(found.table_owner);
    return found;
  });
}

std::string role_name(Oid role) {
  return pg_call([&] {
    const char* name = GetUserNameFromId(role, true);
    return std::string(name != nullptr ? name : "(dropped role)");
  });
}

std::string schema_name(Oid schema) {
  return pg_call([&] {
    const char* name = get_namespace_name(schema);
    return std::string(name != nullptr ? name : "(dropped schema)");
  });
}

// Refuses an installation that an untrusted role could have shaped.
Installation checked(Oid schema) {
  const Found found = look_up(schema);
  const char* hint = "Only superusers may own the extension's schema and table; see SECURITY.md.";
  if (!found.schema_exists)
    throw Error(ERRCODE_UNDEFINED_SCHEMA, "the schema of extension idempotency does not exist");
  if (!found.schema_owner_is_superuser)
    throw Error(ERRCODE_INSUFFICIENT_PRIVILEGE,
                "schema \"" + schema_name(schema) +
                    "\" of extension idempotency is owned by role \"" +
                    role_name(found.schema_owner) + "\", which is not a superuser",
                {}, hint);
  if (!OidIsValid(found.table))
    throw Error(
        ERRCODE_UNDEFINED_TABLE,
        "idempotency_keys does not exist in the extension's schema \"" + schema_name(schema) + "\"",
        {}, "Drop and create the extension idempotency again.");
  if (found.table_kind != RELKIND_RELATION)
    throw Error(ERRCODE_WRONG_OBJECT_TYPE, "idempotency_keys in schema \"" + schema_name(schema) +
                                               "\" is not an ordinary table");
  if (!found.table_owner_is_superuser)
    throw Error(ERRCODE_INSUFFICIENT_PRIVILEGE,
                "table idempotency_keys of extension idempotency is owned by role \"" +
                    role_name(found.table_owner) + "\", which is not a superuser",
                {}, hint);
  return {schema, found.table, found.table_owner};
}

}  // namespace

Installation of_function(Oid function) {
  Oid schema = pg_call([&] { return get_func_namespace(function); });
  return checked(schema);
}

std::optional<Installation> of_database() {
  // pg_extension by name, read by OID-keyed catalog access: no statement, no search_path.
  Oid schema = pg_call([] {
    Oid found = InvalidOid;
    Relation catalog = table_open(ExtensionRelationId, AccessShareLock);
    ScanKeyData key;
    ScanKeyInit(&key, Anum_pg_extension_extname, BTEqualStrategyNumber, F_NAMEEQ,
                CStringGetDatum("idempotency"));
    SysScanDesc scan = systable_beginscan(catalog, ExtensionNameIndexId, true, nullptr, 1, &key);
    HeapTuple tuple = systable_getnext(scan);
    if (HeapTupleIsValid(tuple))
      found = reinterpret_cast<Form_pg_extension>(GETSTRUCT(tuple))->extnamespace;
    systable_endscan(scan);
    table_close(catalog, AccessShareLock);
    return found;
  });
  if (!OidIsValid(schema)) return std::nullopt;
  return checked(schema);
}

Oid calling_role(const char* function_name) {
  if (InSecurityRestrictedOperation())
    throw Error(
        ERRCODE_INSUFFICIENT_PRIVILEGE,
        std::string("cannot call ") + function_name + " inside a security-restricted operation",
        "Index expressions, ANALYZE, autovacuum and REFRESH MATERIALIZED VIEW run code "
        "on behalf of a role that did not ask for it.");
  return GetUserId();
}

ActingAsOwner::ActingAsOwner(const Installation& installation) {
  GetUserIdAndSecContext(&saved_user_, &saved_context_);
  SetUserIdAndSecContext(installation.owner, saved_context_ | SECURITY_LOCAL_USERID_CHANGE |
                                                 SECURITY_RESTRICTED_OPERATION);
  guc_nest_level_ = NewGUCNestLevel();
  active_ = true;
  try {
    pg_call([] {
      (void)set_config_option("search_path", "pg_catalog, pg_temp", PGC_USERSET, PGC_S_SESSION,
                              GUC_ACTION_SAVE, true, 0, false);
    });
  } catch (...) {
    restore();
    throw;
  }
}

ActingAsOwner::~ActingAsOwner() {
  restore();
}

void ActingAsOwner::restore() noexcept {
  if (!active_) return;
  active_ = false;
  // Discards the search_path set above (and anything else set at this nesting level).
  AtEOXact_GUC(false, guc_nest_level_);
  SetUserIdAndSecContext(saved_user_, saved_context_);
}

}  // namespace idem::caller
