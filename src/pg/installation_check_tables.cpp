// The installation check of the extension's tables (see installation_check.hpp): each one an
// ordinary table owned by a superuser with no rights for anyone else, and no code attached
// (triggers, rules, row-level security, policies, checks, inheritance, columns that compute,
// indexes and statistics objects that run functions). Plain PostgreSQL code: palloc'd
// strings, catalog scans, no C++ object with a destructor.
#include "installation_check_internal.hpp"
#include "../key_layout.hpp"

namespace idem::installation_check {
namespace {

constexpr const char* kCodeHint =
    "Code on the extension's tables would run as their owner, a superuser, inside every "
    "role's calls: remove it (see SECURITY.md).";

bool is_built_in(Oid object) {
  return object < FirstNormalObjectId;
}

// Does `acl` give any right to a role that is neither `owner` nor a superuser? With TRIGGER
// on idempotency_keys such a role would run code as the owner inside every call; with
// SELECT it would read every role's keys (on key_lock_salt: tell keys in pg_locks).
bool grants_untrusted(Datum acl_datum, Oid owner, Oid* grantee) {
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

// Rights on the table `relation` (named `name`) or on one of its columns.
// pg-frame: runs inside pg/installation.hpp's pg_call only (owns no C++ object).
bool check_grants(Oid relation, const char* name, Oid owner, Refusal* refusal) {
  const char* hint = psprintf(
      "Only the extension owner may hold rights on its tables: REVOKE ALL ON idempotency.%s "
      "FROM that role.",
      name);
  HeapTuple tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(relation));
  if (!HeapTupleIsValid(tuple)) elog(ERROR, "cache lookup failed for relation %u", relation);
  const int columns = reinterpret_cast<Form_pg_class>(GETSTRUCT(tuple))->relnatts;
  bool is_null = true;
  Datum acl = SysCacheGetAttr(RELOID, tuple, Anum_pg_class_relacl, &is_null);
  Oid grantee = InvalidOid;
  const bool untrusted = !is_null && grants_untrusted(acl, owner, &grantee);
  ReleaseSysCache(tuple);
  if (untrusted)
    return refuse(refusal, ERRCODE_INSUFFICIENT_PRIVILEGE,
                  psprintf("table %s of extension idempotency grants rights to %s, which is not "
                           "a superuser",
                           name, quoted_role(grantee)),
                  hint);
  for (int column = 1; column <= columns; ++column) {
    tuple = SearchSysCache2(ATTNUM, ObjectIdGetDatum(relation), Int16GetDatum(column));
    if (!HeapTupleIsValid(tuple)) continue;
    const char* column_name =
        pstrdup(NameStr(reinterpret_cast<Form_pg_attribute>(GETSTRUCT(tuple))->attname));
    acl = SysCacheGetAttr(ATTNUM, tuple, Anum_pg_attribute_attacl, &is_null);
    const bool column_untrusted = !is_null && grants_untrusted(acl, owner, &grantee);
    ReleaseSysCache(tuple);
    if (column_untrusted)
      return refuse(refusal, ERRCODE_INSUFFICIENT_PRIVILEGE,
                    psprintf("column %s of table %s of extension idempotency grants rights to "
                             "%s, which is not a superuser",
                             column_name, name, quoted_role(grantee)),
                    hint);
  }
  return true;
}

// The first row of `catalog` whose first index column (of `index`) is `relation`; the
// value of its name column `name_column`, or nullptr when there is none.
// pg-frame: runs inside pg/installation.hpp's pg_call only (owns no C++ object).
const char* first_name_of(Oid catalog, Oid index, AttrNumber key_column, Oid relation,
                          AttrNumber name_column) {
  Relation rel = table_open(catalog, AccessShareLock);
  ScanKeyData key;
  ScanKeyInit(&key, key_column, BTEqualStrategyNumber, F_OIDEQ, ObjectIdGetDatum(relation));
  SysScanDesc scan = systable_beginscan(rel, index, true, nullptr, 1, &key);
  HeapTuple tuple = systable_getnext(scan);
  const char* name = nullptr;
  if (HeapTupleIsValid(tuple)) {
    if (name_column == InvalidAttrNumber) {
      name = "";
    } else {
      bool is_null = true;
      Datum value = heap_getattr(tuple, name_column, RelationGetDescr(rel), &is_null);
      name = is_null ? "" : pstrdup(NameStr(*DatumGetName(value)));
    }
  }
  systable_endscan(scan);
  table_close(rel, AccessShareLock);
  return name;
}

// The constant defaults that the install script gives idempotency_keys: nothing else may
// compute a value as the owner.
enum class DefaultValue { kEmptyText, kOne, kProcessing };
struct ExpectedDefault {
  const char* column;
  DefaultValue value;
};
constexpr ExpectedDefault kKeyTableDefaults[] = {{"scope", DefaultValue::kEmptyText},
                                                 {"attempts", DefaultValue::kOne},
                                                 {"status", DefaultValue::kProcessing}};

// pg-frame: runs inside pg/installation.hpp's pg_call only (owns no C++ object).
bool is_expected_default(const Form_pg_attribute attribute, const char* expression) {
  const ExpectedDefault* expected = nullptr;
  for (const ExpectedDefault& candidate : kKeyTableDefaults)
    if (strcmp(NameStr(attribute->attname), candidate.column) == 0) expected = &candidate;
  if (expected == nullptr || expression == nullptr) return false;
  Node* node = static_cast<Node*>(stringToNode(expression));
  if (node == nullptr || !IsA(node, Const)) return false;
  const Const* value = castNode(Const, node);
  if (value->constisnull || value->consttype != attribute->atttypid) return false;
  switch (expected->value) {
    case DefaultValue::kEmptyText:
      return value->consttype == TEXTOID &&
             VARSIZE_ANY_EXHDR(DatumGetPointer(value->constvalue)) == 0;
    case DefaultValue::kOne:
      return value->consttype == INT4OID && DatumGetInt32(value->constvalue) == 1;
    case DefaultValue::kProcessing:
      return get_typtype(value->consttype) == TYPTYPE_ENUM &&
             DatumGetObjectId(value->constvalue) ==
                 GetSysCacheOid2(ENUMTYPOIDNAME, Anum_pg_enum_oid,
                                 ObjectIdGetDatum(value->consttype), CStringGetDatum("processing"));
  }
  return false;
}

// The columns of `table`: no generated or identity column, no type that brings code of
// someone else's, no default but the install script's.
// pg-frame: runs inside pg/installation.hpp's pg_call only (owns no C++ object).
bool check_columns(Relation table, const Objects& members, bool key_table, const char* what,
                   Refusal* refusal) {
  TupleDesc desc = RelationGetDescr(table);
  const TupleConstr* constraints = desc->constr;
  for (int i = 0; i < desc->natts; ++i) {
    const Form_pg_attribute attribute = TupleDescAttr(desc, i);
    if (attribute->attisdropped) continue;
    const char* column = NameStr(attribute->attname);
    if (attribute->attgenerated != '\0' || attribute->attidentity != '\0')
      return refuse(refusal, ERRCODE_INSUFFICIENT_PRIVILEGE,
                    psprintf("column \"%s\" of %s of extension idempotency is %s column", column,
                             what, attribute->attgenerated != '\0' ? "a generated" : "an identity"),
                    kCodeHint);
    if (!is_built_in(attribute->atttypid) && !members.contains(TypeRelationId, attribute->atttypid))
      return refuse(refusal, ERRCODE_INSUFFICIENT_PRIVILEGE,
                    psprintf("column \"%s\" of %s of extension idempotency is of type %s, which "
                             "is neither built in nor the extension's",
                             column, what, format_type_be_qualified(attribute->atttypid)),
                    "A domain checks and defaults its values, other types bring functions of "
                    "their own: use a built-in type, or drop the column.");
    if (!attribute->atthasdef) continue;
    const char* expression = nullptr;
    for (int d = 0; constraints != nullptr && d < constraints->num_defval; ++d)
      if (constraints->defval[d].adnum == attribute->attnum)
        expression = constraints->defval[d].adbin;
    if (!key_table || !is_expected_default(attribute, expression))
      return refuse(refusal, ERRCODE_INSUFFICIENT_PRIVILEGE,
                    psprintf("column \"%s\" of %s of extension idempotency has a default that "
                             "the extension did not give it",
                             column, what),
                    psprintf("%s ALTER TABLE idempotency.%s ALTER COLUMN %s DROP DEFAULT.",
                             kCodeHint, RelationGetRelationName(table), column));
  }
  return true;
}

// Indexes and statistics objects of `table`: no expressions, no predicate, nothing but
// built-in access methods and operator classes (whose functions run at every insert).
// pg-frame: runs inside pg/installation.hpp's pg_call only (owns no C++ object).
bool check_indexes(Relation table, const char* what, Refusal* refusal) {
  List* indexes = RelationGetIndexList(table);
  ListCell* cell = nullptr;
  foreach (cell, indexes) {
    const Oid index = lfirst_oid(cell);
    HeapTuple tuple = SearchSysCache1(INDEXRELID, ObjectIdGetDatum(index));
    if (!HeapTupleIsValid(tuple)) elog(ERROR, "cache lookup failed for index %u", index);
    bool is_null = true;
    bool computed = !heap_attisnull(tuple, Anum_pg_index_indexprs, nullptr) ||
                    !heap_attisnull(tuple, Anum_pg_index_indpred, nullptr);
    // The one expression allowed: the expiry index's key on 16+, this library's own
    // expiry_bucket(expires_at) (key_layout.hpp), which runs no code of anyone else.
    if (computed && heap_attisnull(tuple, Anum_pg_index_indpred, nullptr) &&
        reinterpret_cast<Form_pg_index>(GETSTRUCT(tuple))->indnatts == 1) {
      Datum expressions = SysCacheGetAttr(INDEXRELID, tuple, Anum_pg_index_indexprs, &is_null);
      computed = !key_layout::is_expiry_bucket_key(
          static_cast<List*>(stringToNode(TextDatumGetCString(expressions))),
          get_attnum(RelationGetRelid(table), "expires_at"));
    }
    const auto* classes = reinterpret_cast<const oidvector*>(
        DatumGetPointer(SysCacheGetAttr(INDEXRELID, tuple, Anum_pg_index_indclass, &is_null)));
    bool foreign_code = false;
    for (int k = 0; !is_null && k < classes->dim1; ++k)
      foreign_code = foreign_code || !is_built_in(classes->values[k]);
    ReleaseSysCache(tuple);
    tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(index));
    if (!HeapTupleIsValid(tuple)) elog(ERROR, "cache lookup failed for relation %u", index);
    foreign_code =
        foreign_code || !is_built_in(reinterpret_cast<Form_pg_class>(GETSTRUCT(tuple))->relam);
    ReleaseSysCache(tuple);
    if (computed || foreign_code)
      return refuse(
          refusal, ERRCODE_INSUFFICIENT_PRIVILEGE,
          psprintf("index \"%s\" on %s of extension idempotency %s", get_rel_name(index), what,
                   computed ? "has expressions or a predicate"
                            : "uses an access method or operator class that is not "
                              "built in"),
          psprintf("%s DROP INDEX idempotency.%s.", kCodeHint, get_rel_name(index)));
  }
  list_free(indexes);
  Relation statistics = table_open(StatisticExtRelationId, AccessShareLock);
  ScanKeyData key;
  ScanKeyInit(&key, Anum_pg_statistic_ext_stxrelid, BTEqualStrategyNumber, F_OIDEQ,
              ObjectIdGetDatum(RelationGetRelid(table)));
  SysScanDesc scan =
      systable_beginscan(statistics, StatisticExtRelidIndexId, true, nullptr, 1, &key);
  const char* computed_statistics = nullptr;
  for (HeapTuple tuple = systable_getnext(scan);
       HeapTupleIsValid(tuple) && computed_statistics == nullptr; tuple = systable_getnext(scan))
    if (!heap_attisnull(tuple, Anum_pg_statistic_ext_stxexprs, RelationGetDescr(statistics)))
      computed_statistics =
          pstrdup(NameStr(reinterpret_cast<Form_pg_statistic_ext>(GETSTRUCT(tuple))->stxname));
  systable_endscan(scan);
  table_close(statistics, AccessShareLock);
  if (computed_statistics != nullptr)
    return refuse(refusal, ERRCODE_INSUFFICIENT_PRIVILEGE,
                  psprintf("statistics object \"%s\" on %s of extension idempotency has "
                           "expressions (ANALYZE evaluates them as the table's owner)",
                           computed_statistics, what),
                  kCodeHint);
  return true;
}

// The triggers of `table` (named `what` in messages): none that a claim fires (TRUNCATE-only
// and internal ones are allowed), and no foreign key, whose actions run code on the other table.
// pg-frame: runs inside pg/installation.hpp's pg_call only (owns no C++ object).
bool check_triggers(Relation table, const char* what, Refusal* refusal) {
  if (table->trigdesc != nullptr) {
    for (int i = 0; i < table->trigdesc->numtriggers; ++i) {
      const Trigger& trigger = table->trigdesc->triggers[i];
      if (OidIsValid(trigger.tgconstrrelid))
        return refuse(refusal, ERRCODE_INSUFFICIENT_PRIVILEGE,
                      psprintf("%s of extension idempotency takes part in foreign key "
                               "constraint \"%s\"",
                               what, get_constraint_name(trigger.tgconstraint)),
                      "A foreign key's actions run code on the other table for every change "
                      "of the extension's: drop the constraint.");
      const bool fires_on_writes =
          (trigger.tgtype & (TRIGGER_TYPE_INSERT | TRIGGER_TYPE_DELETE | TRIGGER_TYPE_UPDATE)) != 0;
      if (trigger.tgisinternal || !fires_on_writes) continue;
      return refuse(
          refusal, ERRCODE_INSUFFICIENT_PRIVILEGE,
          psprintf("%s of extension idempotency has trigger \"%s\"", what, trigger.tgname),
          psprintf("%s DROP TRIGGER %s ON idempotency.%s.", kCodeHint,
                   quote_identifier(trigger.tgname), RelationGetRelationName(table)));
    }
  }
  return true;
}

}  // namespace

// No code attached to `table`, an extension table (`key_table`: idempotency_keys or one of
// its Citus shards, which may keep the install script's defaults).
// pg-frame: runs inside pg/installation.hpp's pg_call only (owns no C++ object).
bool check_code(Relation table, const Objects& members, bool key_table, Refusal* refusal) {
  const Oid relation = RelationGetRelid(table);
  const char* what = psprintf("table %s", RelationGetRelationName(table));
  if (!check_triggers(table, what, refusal)) return false;
  if (table->rd_rules != nullptr && table->rd_rules->numLocks > 0)
    return refuse(
        refusal, ERRCODE_INSUFFICIENT_PRIVILEGE,
        psprintf("%s of extension idempotency has rule \"%s\"", what,
                 first_name_of(RewriteRelationId, RewriteRelRulenameIndexId,
                               Anum_pg_rewrite_ev_class, relation, Anum_pg_rewrite_rulename)),
        kCodeHint);
  if (table->rd_rel->relrowsecurity || table->rd_rel->relforcerowsecurity)
    return refuse(refusal, ERRCODE_INSUFFICIENT_PRIVILEGE,
                  psprintf("%s of extension idempotency has row-level security enabled", what),
                  psprintf("%s ALTER TABLE idempotency.%s DISABLE ROW LEVEL SECURITY, NO FORCE "
                           "ROW LEVEL SECURITY.",
                           kCodeHint, RelationGetRelationName(table)));
  if (const char* policy = first_name_of(PolicyRelationId, PolicyPolrelidPolnameIndexId,
                                         Anum_pg_policy_polrelid, relation, Anum_pg_policy_polname))
    return refuse(refusal, ERRCODE_INSUFFICIENT_PRIVILEGE,
                  psprintf("%s of extension idempotency has policy \"%s\"", what, policy),
                  kCodeHint);
  const TupleConstr* constraints = RelationGetDescr(table)->constr;
  if (constraints != nullptr && constraints->num_check > 0)
    return refuse(refusal, ERRCODE_INSUFFICIENT_PRIVILEGE,
                  psprintf("%s of extension idempotency has check constraint \"%s\"", what,
                           constraints->check[0].ccname),
                  kCodeHint);
  if (first_name_of(InheritsRelationId, InheritsParentIndexId, Anum_pg_inherits_inhparent, relation,
                    InvalidAttrNumber) != nullptr ||
      first_name_of(InheritsRelationId, InheritsRelidSeqnoIndexId, Anum_pg_inherits_inhrelid,
                    relation, InvalidAttrNumber) != nullptr)
    return refuse(refusal, ERRCODE_INSUFFICIENT_PRIVILEGE,
                  psprintf("%s of extension idempotency has an inheritance parent or child (or "
                           "is a partition)",
                           what),
                  "A parent's or child's triggers, defaults and constraints would be the "
                  "extension's too: detach them.");
  return check_columns(table, members, key_table, what, refusal) &&
         check_indexes(table, what, refusal);
}

// The extension's table `name` in `schema`, checked: an ordinary table owned by a
// superuser, no rights for anyone else, no code. InvalidOid (and no refusal) when it is
// missing and `required` is false.
// pg-frame: runs inside pg/installation.hpp's pg_call only (owns no C++ object).
bool check_table(Oid schema, const Objects& members, const char* name, bool required, LOCKMODE lock,
                 Oid* table, Oid* owner, Refusal* refusal) {
  *table = get_relname_relid(name, schema);
  if (!OidIsValid(*table)) {
    if (!required) return true;
    return refuse(refusal, ERRCODE_UNDEFINED_TABLE,
                  psprintf("%s does not exist in the extension's schema \"%s\"", name,
                           get_namespace_name(schema)),
                  "Drop and create the extension idempotency again.");
  }
  Relation relation = relation_open(*table, lock);
  const char kind = relation->rd_rel->relkind;
  *owner = relation->rd_rel->relowner;
  bool safe = true;
  if (kind != RELKIND_RELATION)
    safe = refuse(
        refusal, ERRCODE_WRONG_OBJECT_TYPE,
        psprintf("%s in schema \"%s\" is not an ordinary table", name, get_namespace_name(schema)),
        nullptr);
  else if (!superuser_arg(*owner))
    safe = refuse(refusal, ERRCODE_INSUFFICIENT_PRIVILEGE,
                  psprintf("table %s of extension idempotency is owned by %s, which is not a "
                           "superuser",
                           name, quoted_role(*owner)),
                  kOwnerHint);
  else
    safe = check_grants(*table, name, *owner, refusal) &&
           check_code(relation, members, strcmp(name, kTableName) == 0, refusal);
  relation_close(relation, NoLock);
  return safe;
}

}  // namespace idem::installation_check
