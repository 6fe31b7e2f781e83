// Who calls, and the switch to the extension owner (see caller.hpp).
#include "caller.hpp"

#include "pg_boundary.hpp"

namespace idem::caller {
namespace {

constexpr const char* kTableName = "idempotency_keys";
constexpr const char* kSaltTableName = "key_lock_salt";

// What the catalogs say about a schema and the table in it, read in one pg_call.
struct Found {
  // A role that is neither the table's owner nor a superuser but holds a right on one of the
  // extension's tables (InvalidOid: none; ACL_ID_PUBLIC: PUBLIC).
  bool untrusted_grant = false;
  Oid untrusted_grantee = InvalidOid;
  const char* granted_table = nullptr;
  bool schema_exists = false;
  Oid schema_owner = InvalidOid;
  bool schema_owner_is_superuser = false;
  Oid table = InvalidOid;
  char table_kind = 0;
  Oid table_owner = InvalidOid;
  bool table_owner_is_superuser = false;
};

// Does the ACL of `tuple` (a pg_class row owned by `owner`) give any right to a role that is
// neither the owner nor a superuser? With TRIGGER on idempotency_keys such a role would run
// code as the owner inside every call; with SELECT it would read every role's keys.
bool grants_untrusted(HeapTuple tuple, Oid owner, Oid* grantee) {
  bool is_null = true;
  Datum acl_datum = SysCacheGetAttr(RELOID, tuple, Anum_pg_class_relacl, &is_null);
  if (is_null) return false;
  Acl* acl = DatumGetAclP(acl_datum);
  const AclItem* items = ACL_DAT(acl);
  for (int i = 0; i < ACL_NUM(acl); ++i) {
    const Oid role = items[i].ai_grantee;
    if (role == owner || ACLITEM_GET_PRIVS(items[i]) == 0) continue;
    if (role == ACL_ID_PUBLIC || !superuser_arg(role)) {
      *grantee = role;
      return true;
    }
  }
  return false;
}

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
    if (grants_untrusted(tuple, found.table_owner, &found.untrusted_grantee)) {
      found.untrusted_grant = true;
      found.granted_table = kTableName;
    }
    ReleaseSysCache(tuple);
    found.table_owner_is_superuser = superuser_arg(found.table_owner);
    // The salt of the key locks (key_lock.cpp): a role that reads it can tell keys in pg_locks.
    Oid salt = get_relname_relid(kSaltTableName, schema);
    tuple = OidIsValid(salt) ? SearchSysCache1(RELOID, ObjectIdGetDatum(salt)) : nullptr;
    if (HeapTupleIsValid(tuple)) {
      Oid salt_owner = reinterpret_cast<Form_pg_class>(GETSTRUCT(tuple))->relowner;
      if (!found.untrusted_grant && grants_untrusted(tuple, salt_owner, &found.untrusted_grantee)) {
        found.untrusted_grant = true;
        found.granted_table = kSaltTableName;
      }
      ReleaseSysCache(tuple);
    }
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
  if (found.untrusted_grant)
    throw Error(ERRCODE_INSUFFICIENT_PRIVILEGE,
                std::string("table ") + found.granted_table +
                    " of extension idempotency grants rights to " +
                    (found.untrusted_grantee == ACL_ID_PUBLIC
                         ? std::string("PUBLIC")
                         : "role \"" + role_name(found.untrusted_grantee) + "\"") +
                    ", which is not a superuser",
                {},
                std::string("Only the extension owner may hold rights on its tables: REVOKE ALL ON "
                            "idempotency.") +
                    found.granted_table + " FROM that role.");
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

namespace {
// The last role named, kept for the backend's life in TopMemoryContext (one role calls,
// almost always). A rename or drop of any role forgets it.
struct NamedRole {
  Oid role = InvalidOid;
  text* name = nullptr;
};
NamedRole named_role;

void forget_role_name(Datum, SyscacheId, uint32) {
  named_role.role = InvalidOid;
}
}  // namespace

text* name_of(Oid role) {
  if (role == named_role.role) return named_role.name;
  static bool registered = false;
  if (!registered) {
    CacheRegisterSyscacheCallback(AUTHOID, forget_role_name, 0);
    registered = true;
  }
  text* name = pg_call([&] {
    HeapTuple tuple = SearchSysCache1(AUTHOID, ObjectIdGetDatum(role));
    if (!HeapTupleIsValid(tuple))
      ereport(ERROR, (errcode(ERRCODE_UNDEFINED_OBJECT), errmsg("role %u does not exist", role)));
    MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);
    text* copy = cstring_to_text(NameStr(reinterpret_cast<Form_pg_authid>(GETSTRUCT(tuple))->rolname));
    MemoryContextSwitchTo(old);
    ReleaseSysCache(tuple);
    return copy;
  });
  if (named_role.name != nullptr) pfree(named_role.name);
  named_role = {role, name};
  return name;
}

ActingAsOwner::ActingAsOwner(const Installation& installation, SearchPath when) {
  GetUserIdAndSecContext(&saved_user_, &saved_context_);
  SetUserIdAndSecContext(installation.owner, saved_context_ | SECURITY_LOCAL_USERID_CHANGE |
                                                 SECURITY_RESTRICTED_OPERATION);
  active_ = true;
  if (when == SearchPath::kNow) {
    try {
      pin_search_path();
    } catch (...) {
      restore();
      throw;
    }
  }
}

void ActingAsOwner::pin_search_path() {
  if (!active_ || guc_nest_level_ != 0) return;
  guc_nest_level_ = NewGUCNestLevel();
  pg_call([] {
    (void)set_config_option("search_path", "pg_catalog, pg_temp", PGC_USERSET, PGC_S_SESSION,
                            GUC_ACTION_SAVE, true, 0, false);
  });
}

ActingAsOwner::~ActingAsOwner() {
  restore();
}

void ActingAsOwner::restore() noexcept {
  if (!active_) return;
  active_ = false;
  // Discards the search_path set above (and anything else set at this nesting level).
  if (guc_nest_level_ != 0) AtEOXact_GUC(false, guc_nest_level_);
  SetUserIdAndSecContext(saved_user_, saved_context_);
}

}  // namespace idem::caller
