// Settings (GUCs) changed for a while by C++, and put back. Every wrapper that may raise
// catches (pg_call).
#pragma once

#include "../pg_boundary.hpp"

namespace idem::pg::gucs {

// Opens a new GUC nesting level and returns it. Raises not: it only increments a counter.
// pg-frame: a counter increment cannot raise.
inline int new_nest_level() {
  return NewGUCNestLevel();  // pg: only increments the nesting counter
}
// Sets `name` to `value` for this session at the current nesting level, to be put back by
// restore_nest_level(). Raises (no such setting, an invalid value). Allocates the old value's
// copy in the GUC machinery's own memory.
inline void set_at_nest_level(const char* name, const char* value) {
  pg_call([&] {
    (void)set_config_option(name, value, PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE, true, 0,
                            false);
  });
}
// Puts back every setting changed at nesting level `level` and above (AtEOXact_GUC, not
// committing them). Called from destructors, so without pg_call: it only restores saved
// values, which cannot fail for the settings set above.
// pg-frame: restoring saved values does not raise; called from noexcept code.
inline void restore_nest_level(int level) noexcept {
  AtEOXact_GUC(false, level);
}

// Is the boolean setting `name` set off for the current database (ALTER DATABASE ... SET,
// for every role), as pg_db_role_setting reads with a catalog snapshot taken now (a setting
// committed before the call is seen)? Raises (a catalog read failure, out of memory).
// Allocates the settings' text copies in the current memory context.
inline bool off_for_database(const char* name) {
  return pg_call([&] {
    InvalidateCatalogSnapshot();
    bool off = false;
    Relation catalog = table_open(DbRoleSettingRelationId, AccessShareLock);
    ScanKeyData keys[2];
    ScanKeyInit(&keys[0], Anum_pg_db_role_setting_setdatabase, BTEqualStrategyNumber, F_OIDEQ,
                ObjectIdGetDatum(MyDatabaseId));
    ScanKeyInit(&keys[1], Anum_pg_db_role_setting_setrole, BTEqualStrategyNumber, F_OIDEQ,
                ObjectIdGetDatum(InvalidOid));
    SysScanDesc scan =
        systable_beginscan(catalog, DbRoleSettingDatidRolidIndexId, true, nullptr, 2, keys);
    HeapTuple tuple = systable_getnext(scan);
    bool is_null = true;
    Datum config = HeapTupleIsValid(tuple) ? heap_getattr(tuple, Anum_pg_db_role_setting_setconfig,
                                                          RelationGetDescr(catalog), &is_null)
                                           : static_cast<Datum>(0);
    if (!is_null) {
      Datum* items = nullptr;
      int count = 0;
      deconstruct_array(DatumGetArrayTypeP(config), TEXTOID, -1, false, TYPALIGN_INT, &items,
                        nullptr, &count);
      const size_t length = strlen(name);
      for (int i = 0; i < count; ++i) {
        const char* item = TextDatumGetCString(items[i]);
        bool value = true;
        if (pg_strncasecmp(item, name, length) == 0 && item[length] == '=' &&
            parse_bool(item + length + 1, &value) && !value)
          off = true;
      }
    }
    systable_endscan(scan);
    table_close(catalog, AccessShareLock);
    return off;
  });
}

}  // namespace idem::pg::gucs
