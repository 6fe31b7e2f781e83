// Tables read directly (a heap scan), as C++ reads the extension's small tables. Every
// wrapper catches (pg_call).
#pragma once

#include "../pg_boundary.hpp"

namespace idem::pg::heap {

// The first column (a bytea) of the first row of the table `name` in the schema of `beside`,
// read with the latest snapshot, copied into `out` (at most `capacity` bytes); returns how
// many bytes were copied (0 for no row or NULL). Raises 42P01 when there is no such table.
// Takes and releases AccessShareLock on it; allocates in the current memory context.
inline size_t first_bytea(Oid beside, const char* name, uint8* out, size_t capacity) {
  return pg_call([&] {
    const Oid table = get_relname_relid(name, get_rel_namespace(beside));
    if (!OidIsValid(table))
      ereport(ERROR, (errcode(ERRCODE_UNDEFINED_TABLE),
                      errmsg("%s does not exist in the extension's schema", name),
                      errhint("Drop and create the extension idempotency again.")));
    Relation relation = table_open(table, AccessShareLock);
#if PG_VERSION_NUM >= 190000  // table_beginscan gained a flags argument
    TableScanDesc scan = table_beginscan(relation, GetLatestSnapshot(), 0, nullptr, SO_NONE);
#else
    TableScanDesc scan = table_beginscan(relation, GetLatestSnapshot(), 0, nullptr);
#endif
    HeapTuple tuple = heap_getnext(scan, ForwardScanDirection);
    bool is_null = true;
    const Datum value = HeapTupleIsValid(tuple)
                            ? heap_getattr(tuple, 1, RelationGetDescr(relation), &is_null)
                            : static_cast<Datum>(0);
    size_t length = 0;
    if (!is_null) {
      bytea* bytes = DatumGetByteaPP(value);
      length = std::min<size_t>(VARSIZE_ANY_EXHDR(bytes), capacity);
      memcpy(out, VARDATA_ANY(bytes), length);
    }
    table_endscan(scan);
    table_close(relation, AccessShareLock);
    return length;
  });
}

// The number of blocks of `relation`, 0 when it was dropped meanwhile. Raises (an I/O
// error). Takes and releases AccessShareLock on it; allocates nothing that outlives the call.
inline BlockNumber block_count(Oid relation) {
  return pg_call([&] {
    Relation open = try_relation_open(relation, AccessShareLock);
    if (open == nullptr) return BlockNumber{0};
    BlockNumber count = RelationGetNumberOfBlocks(open);
    relation_close(open, AccessShareLock);
    return count;
  });
}

}  // namespace idem::pg::heap
