// Who calls, and the switch to the extension owner (see caller.hpp).
#include "caller.hpp"

#include "pg/catalog.hpp"
#include "pg/gucs.hpp"
#include "pg/installation.hpp"
#include "pg/memory.hpp"

namespace idem::caller {
namespace {

// The installation last found safe, kept until a catalog change that could make it unsafe
// (the callbacks below): the full check reads a dozen catalogs, far more than a claim costs.
// Only a safe result is kept; a refusal is worked out again at every call.
struct Checked {
  bool valid = false;
  Installation installation{};
  // Functions already found in that schema (the SQL functions of the extension).
  Oid functions[16] = {};
  int function_count = 0;
  // Roles already found with USAGE on that schema (SPEC §7: only they call).
  Oid usage_roles[4] = {};
  int usage_role_count = 0;
};
Checked checked_installation;

// Counts invalidations: one that arrives while the check reads the catalogs (the first lock
// on a catalog processes pending messages) makes the check start over, so that a result is
// never kept across a change it did not see.
uint64 invalidations = 0;

void forget() {
  ++invalidations;
  checked_installation.valid = false;
}
void forget_relation(Datum, Oid) {
  forget();
}
void forget_catalog_row(Datum, SyscacheId, uint32) {
  forget();
}

// Every catalog the check reads, or whose change could make a safe installation unsafe:
// schemas (owner, ACL), roles (superuser) and memberships (who has a grantee's rights), the
// relcache (tables: owner, ACLs, triggers, rules, policies, constraints, defaults, columns,
// indexes, statistics objects, inheritance; and every relation created in or moved into the
// schema), and the catalogs of every other kind of object that lives in a schema.
void register_callbacks() {
  static bool registered = false;
  if (registered) return;
  registered = true;
  pg::catalog::on_relcache_change(forget_relation);
  for (SyscacheId cache :
       {NAMESPACEOID, AUTHOID, AUTHMEMMEMROLE, PROCOID, TYPEOID, OPEROID, COLLOID, CONVOID, CLAOID,
        OPFAMILYOID, TSCONFIGOID, TSDICTOID, TSPARSEROID, TSTEMPLATEOID, STATEXTOID})
    pg::catalog::on_syscache_change(cache, forget_catalog_row);
}

// The installation in `schema`, checked in full (installation_check.hpp).
Installation checked(Oid schema) {
  installation_check::Found found;
  installation_check::Refusal refusal;
  bool safe = false;
  for (uint64 seen = invalidations - 1; seen != invalidations;) {
    seen = invalidations;
    safe = pg::installation::examine(schema, &found, &refusal);
    if (!safe) break;
  }
  if (!safe)
    throw Error(refusal.sqlstate, refusal.message, {},
                refusal.hint != nullptr ? refusal.hint : std::string());
  return {schema, found.table, found.owner};
}

// The checked installation of `schema`, from the cache when it is still valid.
Installation cached(Oid schema, Oid function) {
  Checked& cache = checked_installation;
  if (!cache.valid || cache.installation.schema != schema) {
    Installation installation = checked(schema);
    cache = Checked{};
    cache.installation = installation;
    cache.valid = true;
  }
  if (OidIsValid(function) && cache.function_count < 16)
    cache.functions[cache.function_count++] = function;
  return cache.installation;
}

// Refuses `role` unless it has USAGE on the installation's schema: a call reached by OID (a
// BEGIN ATOMIC body, a view, a kept plan) never passed the schema's name lookup. The right
// may come through a membership, so the verdict is kept only until the callbacks above
// (pg_namespace, pg_authid, pg_auth_members) forget the installation.
void require_usage(Oid function, const Installation& installation, Oid role) {
  Checked& cache = checked_installation;
  if (cache.valid && cache.installation.schema == installation.schema)
    for (int i = 0; i < cache.usage_role_count; ++i)
      if (cache.usage_roles[i] == role) return;
  bool has_usage = false;
  for (uint64 seen = invalidations - 1; seen != invalidations;) {
    seen = invalidations;
    has_usage = pg::catalog::has_schema_usage(installation.schema, role);
  }
  if (!has_usage) {
    const char* schema_name = pg::catalog::schema_name(installation.schema);
    const char* function_name = pg::catalog::function_name(function);
    const std::string schema = schema_name != nullptr ? schema_name : "?";
    const std::string name = function_name != nullptr ? function_name : "?";
    throw Error(ERRCODE_INSUFFICIENT_PRIVILEGE, "permission denied for schema " + schema,
                name +
                    " needs USAGE on the schema of extension idempotency, however it is "
                    "called (by name, from a function body, a view or a kept plan).",
                "GRANT USAGE ON SCHEMA " + schema + " TO the role that calls (see SECURITY.md).");
  }
  if (cache.valid && cache.installation.schema == installation.schema) {
    if (cache.usage_role_count == 4) cache.usage_role_count = 0;  // a few roles: start over
    cache.usage_roles[cache.usage_role_count++] = role;
  }
}

}  // namespace

Installation of_function(Oid function) {
  register_callbacks();
  // Changes committed by other sessions since this transaction last looked (a cheap test
  // when there are none): the next call after an unsafe change refuses, even in a
  // transaction that has all its locks already.
  pg::catalog::accept_invalidations();
  const Oid role = GetUserId();
  const Checked& cache = checked_installation;
  if (cache.valid)
    for (int i = 0; i < cache.function_count; ++i)
      if (cache.functions[i] == function) {
        for (int j = 0; j < cache.usage_role_count; ++j)
          if (cache.usage_roles[j] == role) return cache.installation;
        const Installation installation = cache.installation;
        require_usage(function, installation, role);
        return installation;
      }
  Oid schema = pg::catalog::function_schema(function);
  const Installation installation = cached(schema, function);
  require_usage(function, installation, role);
  return installation;
}

std::optional<Installation> of_database() {
  register_callbacks();
  Oid schema = pg::installation::extension_schema();
  if (!OidIsValid(schema)) return std::nullopt;
  return cached(schema, InvalidOid);
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
    pg::catalog::on_syscache_change(AUTHOID, forget_role_name);
    registered = true;
  }
  text* name = pg::catalog::role_name(role, TopMemoryContext);
  if (named_role.name != nullptr) pg::memory::free(named_role.name);
  named_role = {role, name};
  return name;
}

int64 system_identifier() {
  static int64 identifier = 0;
  if (identifier == 0) identifier = static_cast<int64>(GetSystemIdentifier());
  return identifier;
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
  guc_nest_level_ = pg::gucs::new_nest_level();
  pg::gucs::set_at_nest_level("search_path", "pg_catalog, pg_temp");
}

ActingAsOwner::~ActingAsOwner() {
  restore();
}

void ActingAsOwner::restore() noexcept {
  if (!active_) return;
  active_ = false;
  // Discards the search_path set above (and anything else set at this nesting level).
  if (guc_nest_level_ != 0) pg::gucs::restore_nest_level(guc_nest_level_);
  SetUserIdAndSecContext(saved_user_, saved_context_);
}

}  // namespace idem::caller
