// The full check of an installation (see installation_check.hpp): its entry points, in the
// order of the check (the schema, the extension, its tables, every object in the schema),
// and the helpers every part uses. The tables are checked in installation_check_tables.cpp,
// the schema and its objects in installation_check_schema.cpp. Plain PostgreSQL code:
// palloc'd strings, catalog scans, no C++ object with a destructor. It sits in the layer
// (src/pg/) because it runs only as the one call of pg::installation (installation.hpp).
#include "installation_check_internal.hpp"

namespace idem::installation_check {
namespace {

constexpr const char* kSaltTableName = "key_lock_salt";

}  // namespace

// 'role "name"', or PUBLIC.
// pg-frame: runs inside pg/installation.hpp's pg_call only (owns no C++ object).
const char* quoted_role(Oid role) {
  if (role == ACL_ID_PUBLIC) return "PUBLIC";
  const char* name = GetUserNameFromId(role, true);
  return name != nullptr ? psprintf("role \"%s\"", name) : psprintf("role %u", role);
}

// The objects that depend on (`class_id`, `object_id`), by a dependency of type `type`
// (0: any), in one scan of pg_depend's reference index.
// pg-frame: runs inside pg/installation.hpp's pg_call only (owns no C++ object).
Objects dependents_of(Oid class_id, Oid object_id, char type) {
  Relation depend = table_open(DependRelationId, AccessShareLock);
  ScanKeyData keys[2];
  ScanKeyInit(&keys[0], Anum_pg_depend_refclassid, BTEqualStrategyNumber, F_OIDEQ,
              ObjectIdGetDatum(class_id));
  ScanKeyInit(&keys[1], Anum_pg_depend_refobjid, BTEqualStrategyNumber, F_OIDEQ,
              ObjectIdGetDatum(object_id));
  SysScanDesc scan = systable_beginscan(depend, DependReferenceIndexId, true, nullptr, 2, keys);
  Objects found;
  int capacity = 32;
  found.items = static_cast<ObjectAddress*>(palloc(capacity * sizeof(ObjectAddress)));
  for (HeapTuple tuple = systable_getnext(scan); HeapTupleIsValid(tuple);
       tuple = systable_getnext(scan)) {
    const auto* form = reinterpret_cast<Form_pg_depend>(GETSTRUCT(tuple));
    if (type != 0 && form->deptype != type) continue;
    if (found.count == capacity) {
      capacity *= 2;
      found.items =
          static_cast<ObjectAddress*>(repalloc(found.items, capacity * sizeof(ObjectAddress)));
    }
    found.items[found.count++] = {form->classid, form->objid, form->objsubid};
  }
  systable_endscan(scan);
  table_close(depend, AccessShareLock);
  return found;
}

// pg-frame: runs inside a pg_call, or a function PostgreSQL calls, only (owns no C++ object).
bool find_extension(Oid* extension, Oid* schema) {
  // pg_extension by name, read by OID-keyed catalog access: no statement, no search_path.
  *extension = InvalidOid;
  *schema = InvalidOid;
  Relation catalog = table_open(ExtensionRelationId, AccessShareLock);
  ScanKeyData key;
  ScanKeyInit(&key, Anum_pg_extension_extname, BTEqualStrategyNumber, F_NAMEEQ,
              CStringGetDatum("idempotency"));
  SysScanDesc scan = systable_beginscan(catalog, ExtensionNameIndexId, true, nullptr, 1, &key);
  HeapTuple tuple = systable_getnext(scan);
  if (HeapTupleIsValid(tuple)) {
    const auto* form = reinterpret_cast<Form_pg_extension>(GETSTRUCT(tuple));
    *extension = form->oid;
    *schema = form->extnamespace;
  }
  systable_endscan(scan);
  table_close(catalog, AccessShareLock);
  return OidIsValid(*extension);
}

// pg-frame: runs inside pg/installation.hpp's pg_call only (owns no C++ object).
bool examine(Oid schema, Found* found, Refusal* refusal) {
  if (!check_schema(schema, refusal)) return false;
  Oid extension = InvalidOid;
  Oid extension_schema = InvalidOid;
  if (!find_extension(&extension, &extension_schema) || extension_schema != schema)
    return refuse(refusal, ERRCODE_UNDEFINED_OBJECT,
                  psprintf("extension idempotency is not installed in schema \"%s\"",
                           get_namespace_name(schema)),
                  "Call the functions of the extension's own schema.");
  // The extension's members, read once (pg_depend's entries of type 'e' on it).
  const Objects members = dependents_of(ExtensionRelationId, extension, DEPENDENCY_EXTENSION);
  // The lock the claims take next: no second lock mode on the table.
  Oid salt = InvalidOid;
  Oid salt_owner = InvalidOid;
  if (!check_table(schema, members, kTableName, true, RowExclusiveLock, &found->table,
                   &found->owner, refusal) ||
      !check_table(schema, members, kSaltTableName, false, AccessShareLock, &salt, &salt_owner,
                   refusal))
    return false;
  return check_objects(schema, extension, members, refusal);
}

}  // namespace idem::installation_check
