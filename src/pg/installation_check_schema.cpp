// The installation check of the extension's schema (see installation_check.hpp): owned by a
// superuser, nobody else may create objects in it, and it holds the extension's objects only
// (or Citus shards of its tables), each owned by a superuser. Plain PostgreSQL code: palloc'd
// strings, catalog scans, no C++ object with a destructor.
#include "installation_check_internal.hpp"

#include "../citus_guard.hpp"

namespace idem::installation_check {
namespace {

// The catalogs of the objects checked, each opened once for the whole check (opening one
// per object took a lock and its release each time).
struct OpenCatalogs {
  static constexpr int kCapacity = 16;
  Relation relations[kCapacity] = {};
  int count = 0;
  // pg-frame: runs inside pg/installation.hpp's pg_call only (owns no C++ object).
  Relation of(Oid class_id) {
    for (int i = 0; i < count; ++i)
      if (RelationGetRelid(relations[i]) == class_id) return relations[i];
    if (count == kCapacity) close();
    relations[count] = table_open(class_id, AccessShareLock);
    return relations[count++];
  }
  // pg-frame: runs inside pg/installation.hpp's pg_call only (owns no C++ object).
  void close() {
    for (int i = 0; i < count; ++i) table_close(relations[i], AccessShareLock);
    count = 0;
  }
};

// "function idempotency.f(pg_catalog.text)": qualified whatever the caller's search_path.
// pg-frame: runs inside pg/installation.hpp's pg_call only (owns no C++ object).
const char* describe(const ObjectAddress& object) {
  return psprintf("%s %s", getObjectTypeDescription(&object, false),
                  getObjectIdentity(&object, false));
}

// Citus' own owner of a shard move's or split's subscription on this node: created by a
// superuser as a member of the table owner (the extension owner), then stripped of its
// superuser right, and dropped when the move ends. It may create objects in the schema
// through that membership, but nobody can act as it: membership in a superuser's role is
// granted by superusers only, it has no password, and no other role may grant it (no
// ADMIN OPTION outside the superusers). Its members, if any, are still checked like every
// other role's. Set a password or hand out ADMIN OPTION on it and it is refused like any
// other member.
// pg-frame: runs inside pg/installation.hpp's pg_call only (owns no C++ object).
bool citus_transient_role(Oid role) {
  if (!citus_guard::citus_loaded()) return false;
  HeapTuple tuple = SearchSysCache1(AUTHOID, ObjectIdGetDatum(role));
  if (!HeapTupleIsValid(tuple)) return false;
  const char* name = NameStr(reinterpret_cast<Form_pg_authid>(GETSTRUCT(tuple))->rolname);
  bool citus_name = false;
  for (const char* prefix :
       {"citus_shard_move_subscription_role_", "citus_shard_split_subscription_role_"})
    citus_name = citus_name || strncmp(name, prefix, strlen(prefix)) == 0;
  bool no_password = false;
  (void)SysCacheGetAttr(AUTHOID, tuple, Anum_pg_authid_rolpassword, &no_password);
  ReleaseSysCache(tuple);
  if (!citus_name || !no_password) return false;
  bool admin_elsewhere = false;
  CatCList* grants = SearchSysCacheList1(AUTHMEMROLEMEM, ObjectIdGetDatum(role));
  for (int m = 0; m < grants->n_members; ++m) {
    const auto* grant =
        reinterpret_cast<Form_pg_auth_members>(GETSTRUCT(&grants->members[m]->tuple));
    if (grant->admin_option && !superuser_arg(grant->member)) admin_elsewhere = true;
  }
  ReleaseSysCacheList(grants);
  return !admin_elsewhere;
}

// A role other than the superusers that may create objects in `schema` (whose ACL, or its
// owner's default one, is `acl`), as has_schema_privilege sees it: PUBLIC, a grantee of CREATE, or
// a role that has the privileges of one (a member of the owner, say). *creator is ACL_ID_PUBLIC for
// PUBLIC.
// pg-frame: runs inside pg/installation.hpp's pg_call only (owns no C++ object).
bool untrusted_creator(Oid schema, Acl* acl, Oid* creator) {
  int count = 0;
  int capacity = 8;
  Oid* roles = static_cast<Oid*>(palloc(capacity * sizeof(Oid)));
  auto add = [&](Oid role) {
    for (int i = 0; i < count; ++i)
      if (roles[i] == role) return;
    if (count == capacity) {
      capacity *= 2;
      roles = static_cast<Oid*>(repalloc(roles, capacity * sizeof(Oid)));
    }
    roles[count++] = role;
  };
  const AclItem* items = ACL_DAT(acl);
  for (int i = 0; i < ACL_NUM(acl); ++i) {
    if ((ACLITEM_GET_PRIVS(items[i]) & ACL_CREATE) == 0) continue;
    if (items[i].ai_grantee == ACL_ID_PUBLIC) {
      *creator = ACL_ID_PUBLIC;
      return true;
    }
    add(items[i].ai_grantee);
  }
  // Every grantee, then every member of one (transitively): the roles that may hold the
  // privilege. Whether one does (inheritance) is for the ACL check to say.
  for (int i = 0; i < count; ++i) {
    const Oid role = roles[i];
    if (!superuser_arg(role) && !citus_transient_role(role)) {
      const AclResult result = object_acl(NamespaceRelationId, schema, role, ACL_CREATE);
      if (result == ACLCHECK_OK) {
        *creator = role;
        return true;
      }
    }
    CatCList* members = SearchSysCacheList1(AUTHMEMROLEMEM, ObjectIdGetDatum(role));
    for (int m = 0; m < members->n_members; ++m)
      add(reinterpret_cast<Form_pg_auth_members>(GETSTRUCT(&members->members[m]->tuple))->member);
    ReleaseSysCacheList(members);
  }
  return false;
}

// Is `relation` a shard of one of the extension's tables in `schema` (Citus keeps a
// distributed table's rows in tables named after it and the shard's number, in its schema)?
// Sets *of_key_table when the table it shards is idempotency_keys, and *vanished when the
// relation was dropped since it was listed (Citus drops a moved shard at any moment).
// pg-frame: runs inside pg/installation.hpp's pg_call only (owns no C++ object).
bool is_citus_shard(Oid relation, Oid schema, const Objects& members, bool* of_key_table,
                    bool* vanished) {
  if (!citus_guard::citus_loaded()) return false;
  HeapTuple tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(relation));
  if (!HeapTupleIsValid(tuple)) {
    *vanished = true;
    return false;
  }
  const auto* form = reinterpret_cast<Form_pg_class>(GETSTRUCT(tuple));
  char* name = pstrdup(NameStr(form->relname));
  const bool plain_table = form->relkind == RELKIND_RELATION;
  ReleaseSysCache(tuple);
  char* separator = strrchr(name, '_');
  if (!plain_table || separator == nullptr || separator[1] == '\0' ||
      strspn(separator + 1, "0123456789") != strlen(separator + 1))
    return false;
  *separator = '\0';
  const Oid sharded = get_relname_relid(name, schema);
  *of_key_table = strcmp(name, kTableName) == 0;
  return OidIsValid(sharded) && members.contains(RelationRelationId, sharded);
}

// The object at `address` in the extension's schema: owned by a superuser, and not a
// SECURITY DEFINER function (which would act for its owner: everyone's keys in one place).
// pg-frame: runs inside pg/installation.hpp's pg_call only (owns no C++ object).
bool check_object_owner(const ObjectAddress& address, OpenCatalogs& catalogs, Refusal* refusal) {
  const AttrNumber owner_column = get_object_attnum_owner(address.classId);
  if (owner_column == InvalidAttrNumber) return true;
  Relation catalog = catalogs.of(address.classId);
  HeapTuple tuple =
      get_catalog_object_by_oid(catalog, get_object_attnum_oid(address.classId), address.objectId);
  Oid owner = InvalidOid;
  bool definer = false;
  if (HeapTupleIsValid(tuple)) {
    bool is_null = true;
    Datum value = heap_getattr(tuple, owner_column, RelationGetDescr(catalog), &is_null);
    if (!is_null) owner = DatumGetObjectId(value);
    definer = address.classId == ProcedureRelationId &&
              reinterpret_cast<Form_pg_proc>(GETSTRUCT(tuple))->prosecdef;
  }
  if (OidIsValid(owner) && !superuser_arg(owner))
    return refuse(refusal, ERRCODE_INSUFFICIENT_PRIVILEGE,
                  psprintf("%s of extension idempotency is owned by %s, which is not a superuser",
                           describe(address), quoted_role(owner)),
                  kOwnerHint);
  if (definer)
    return refuse(refusal, ERRCODE_INSUFFICIENT_PRIVILEGE,
                  psprintf("%s of extension idempotency is SECURITY DEFINER", describe(address)),
                  "The functions act for their caller: ALTER FUNCTION ... SECURITY INVOKER.");
  return true;
}

}  // namespace

// The schema itself: owned by a superuser, and nobody else may create objects in it.
// pg-frame: runs inside pg/installation.hpp's pg_call only (owns no C++ object).
bool check_schema(Oid schema, Refusal* refusal) {
  HeapTuple tuple = SearchSysCache1(NAMESPACEOID, ObjectIdGetDatum(schema));
  if (!HeapTupleIsValid(tuple))
    return refuse(refusal, ERRCODE_UNDEFINED_SCHEMA,
                  "the schema of extension idempotency does not exist", nullptr);
  const auto* form = reinterpret_cast<Form_pg_namespace>(GETSTRUCT(tuple));
  const Oid owner = form->nspowner;
  const char* name = pstrdup(NameStr(form->nspname));
  bool is_null = true;
  Datum acl_datum = SysCacheGetAttr(NAMESPACEOID, tuple, Anum_pg_namespace_nspacl, &is_null);
  Acl* acl = is_null ? acldefault(OBJECT_SCHEMA, owner) : DatumGetAclPCopy(acl_datum);
  ReleaseSysCache(tuple);
  if (!superuser_arg(owner))
    return refuse(refusal, ERRCODE_INSUFFICIENT_PRIVILEGE,
                  psprintf("schema \"%s\" of extension idempotency is owned by %s, which is not "
                           "a superuser",
                           name, quoted_role(owner)),
                  kOwnerHint);
  Oid creator = InvalidOid;
  if (untrusted_creator(schema, acl, &creator))
    return refuse(
        refusal, ERRCODE_INSUFFICIENT_PRIVILEGE,
        psprintf("%s may create objects in schema \"%s\" of extension idempotency",
                 creator == ACL_ID_PUBLIC
                     ? "PUBLIC"
                     : psprintf("%s, which is not a superuser,", quoted_role(creator)),
                 name),
        psprintf("A role that may create objects there can plant look-alikes of the extension's "
                 "functions, which calls then run: REVOKE CREATE ON SCHEMA %s FROM %s (or from "
                 "the role it has the privilege through).",
                 quote_identifier(name),
                 creator == ACL_ID_PUBLIC ? "PUBLIC"
                                          : quote_identifier(GetUserNameFromId(creator, false))));
  return true;
}

// Every object in `schema` (each one records a dependency on its schema, but those that
// belong to another object: indexes, row and array types): a member of the extension, or a
// Citus shard of one of its tables; each owned by a superuser; a shard without code.
// pg-frame: runs inside pg/installation.hpp's pg_call only (owns no C++ object).
bool check_objects(Oid schema, Oid extension, const Objects& members, Refusal* refusal) {
  const Objects objects = dependents_of(NamespaceRelationId, schema, 0);
  OpenCatalogs catalogs;
  bool safe = true;
  for (int i = 0; safe && i < objects.count; ++i) {
    const ObjectAddress& object = objects.items[i];
    if (object.classId == ExtensionRelationId && object.objectId == extension) continue;
    bool of_key_table = false;
    bool vanished = false;
    const bool member = members.contains(object.classId, object.objectId);
    const bool shard = !member && object.classId == RelationRelationId &&
                       is_citus_shard(object.objectId, schema, members, &of_key_table, &vanished);
    if (vanished) continue;  // dropped since listed: nothing left to check
    if (!member && !shard) {
      safe =
          refuse(refusal, ERRCODE_INSUFFICIENT_PRIVILEGE,
                 psprintf("%s is in schema \"%s\" but not part of extension idempotency",
                          describe(object), get_namespace_name(schema)),
                 "The extension's schema must hold nothing but its own objects (a look-alike there "
                 "could catch calls): drop that object or move it to another schema.");
    } else if (!check_object_owner(object, catalogs, refusal)) {
      safe = false;
    } else if (shard) {
      // try_: a shard dropped after the look above is skipped, not an error.
      Relation table = try_relation_open(object.objectId, AccessShareLock);
      if (table == nullptr) continue;
      safe = check_code(table, members, of_key_table, refusal);
      relation_close(table, NoLock);
    }
  }
  catalogs.close();
  return safe;
}

}  // namespace idem::installation_check
