// What the parts of the installation check share (see installation_check.hpp): the refusal,
// the names, the extension's members, and the checks one part calls in another. Internal to
// installation_check*.cpp. Plain PostgreSQL code: palloc'd strings, no C++ object with a
// destructor.
#pragma once

#include "../installation_check.hpp"

namespace idem::installation_check {

inline constexpr const char* kTableName = "idempotency_keys";
inline constexpr const char* kOwnerHint =
    "Only superusers may own the extension's schema and table; see SECURITY.md.";

// Fills in `*refusal`; false, so that a check can return it.
inline bool refuse(Refusal* refusal, int sqlstate, const char* message, const char* hint) {
  refusal->sqlstate = sqlstate;
  refusal->message = message;
  refusal->hint = hint;
  return false;
}

// Objects found in pg_depend (palloc'd).
struct Objects {
  ObjectAddress* items = nullptr;
  int count = 0;
  bool contains(Oid class_id, Oid object_id) const {
    for (int i = 0; i < count; ++i)
      if (items[i].classId == class_id && items[i].objectId == object_id) return true;
    return false;
  }
};

// installation_check.cpp: who a role is, in a message; the dependents of an object.
const char* quoted_role(Oid role);
Objects dependents_of(Oid class_id, Oid object_id, char type);

// installation_check_tables.cpp: an extension table in `schema` (kind, owner, rights, code);
// the code attached to a table (also a Citus shard's).
bool check_table(Oid schema, const Objects& members, const char* name, bool required, LOCKMODE lock,
                 Oid* table, Oid* owner, Refusal* refusal);
bool check_code(Relation table, const Objects& members, bool key_table, Refusal* refusal);

// installation_check_schema.cpp: the schema (owner, who may create in it); every object in it.
bool check_schema(Oid schema, Refusal* refusal);
bool check_objects(Oid schema, Oid extension, const Objects& members, Refusal* refusal);

}  // namespace idem::installation_check
