// What the direct path knows about the key table: where each column is, the primary key,
// the indexes to maintain, the status labels, and why the table's shape would send writes to
// the executor. Loaded once per backend, forgotten by relcache and syscache callbacks
// whenever the table, one of its indexes or the labels change.
#pragma once

#include "key_row.hpp"
#include "route.hpp"

namespace idem::key_layout {

using key_store::Column;
using key_store::kColumnCount;

// (which a database owner may run) leaves a copy of each index behind, and such leftovers must
// not push every claim onto the executor path.
constexpr int kMaxIndexes = 32;
constexpr int kMaxAttributes = 64;  // live and dropped columns of the table

// The key of the expiry index on PostgreSQL 16 and later, a BRIN over
// expiry_bucket(expires_at): the expiry rounded down to its minute. Keys claimed or completed
// within the same minute then fall inside their block range's summary, so a write seldom
// widens it (no BRIN record in the WAL, no summary rewritten); and since a bucket is never
// later than its expiry, "bucket <= now" finds every expired key (the cleanup checks the
// exact expiry as well). Infinite timestamps are their own bucket.
constexpr int64 kExpiryBucketUs = 60 * USECS_PER_SEC;
inline TimestampTz expiry_bucket(TimestampTz expiry) {
  if (TIMESTAMP_NOT_FINITE(expiry)) return expiry;
  int64 into_bucket = expiry % kExpiryBucketUs;
  if (into_bucket < 0) into_bucket += kExpiryBucketUs;
  return expiry - into_bucket;
}

// Are `expressions` (an index's, as pg_index.indexprs holds them) exactly one call of this
// library's expiry_bucket (whatever its name or schema: the C symbol decides) on the column
// numbered `expires_at`?
// pg-frame: runs inside pg_call only (owns no C++ object).
bool is_expiry_bucket_key(const List* expressions, AttrNumber expires_at);

// What the direct path needs to know about the table (see above).
struct Layout {
  Oid table = InvalidOid;          // InvalidOid: not loaded
  MemoryContext memory = nullptr;  // holds index_info
  Oid primary_key = InvalidOid;
  AttrNumber attnum[kColumnCount] = {};
  Oid processing_label = InvalidOid;
  Oid completed_label = InvalidOid;
  // Why writes need the executor whatever the call (kNone: they do not).
  route::ExecutorReason executor_reason = route::ExecutorReason::kNone;
  int index_count = 0;
  Oid index_oids[kMaxIndexes] = {};
  IndexInfo* index_info[kMaxIndexes] = {};
  // Is the index's one key expiry_bucket(expires_at) (the expiry index of 16+), whose value
  // the direct path computes itself; the layout allows no other expression.
  bool on_expiry_bucket[kMaxIndexes] = {};
};

// The layout of `table` (open and locked), loaded when it is not the one cached; refuses a
// table this version cannot use (a missing column, a wrong type, no primary key on (key,
// scope, owner), a 1.1 table: 55000).
const Layout& of(Relation table);
// The layout last loaded (valid after of() in the same call).
const Layout& current();

// A KeyRow from the columns of a row of the table (values / nulls by attribute number - 1),
// copied into `context`.
key_store::KeyRow decode_values(const Datum* values, const bool* nulls, MemoryContext context);

// 55000 for a table made by 1.0 or 1.1 (owner a regrole), which this library does not serve
// before ALTER EXTENSION UPDATE. Both paths raise it: the direct path from the table's layout
// (of()), the executor path before it prepares its statements (key_store.cpp).
[[noreturn]] void reject_old_table();
// 55000 for a table made by 1.2 (no owner_oid, owner_system), raised the same ways.
[[noreturn]] void reject_unstamped_table();

// The BRIN insert states of the layout's indexes (ii_AmCache) are kept from one direct write to
// the next within a transaction, as the executor keeps them for a statement: building one
// (the BRIN's descriptor; on 17+ the range map's metapage pinned) costs about as much as the
// insert itself. They live in insert_states_context(), their buffer pins held by the
// transaction's top resource owner (a subtransaction's end must not release them), and are
// released when the transaction ends and whenever the layout is forgotten (a relcache entry
// they point to may go). Call insert_states_kept() after an insert that may have built one.
// pg-frame: runs inside pg_call only (owns no C++ object).
MemoryContext insert_states_context();
void insert_states_kept();

// What makes the table unusable by this version (the executor path would misread it too), and
// the column or label concerned.
enum class LayoutProblem { kNone, kMissingColumn, kColumnType, kLabel, kPrimaryKey, kOldVersion };
struct LayoutCheck {
  LayoutProblem problem = LayoutProblem::kNone;
  int column = 0;
};
// Reads the layout of `table` (open and locked) into the cache, from the catalogs and the
// relcache: the one step that pg::storage::read_layout runs, whole, under one pg_call (of()
// calls it, and again when a relcache invalidation arrived meanwhile).
// pg-frame: runs inside pg::storage::read_layout only (owns no C++ object).
LayoutCheck read_into_cache(Relation table);

// Registers the callbacks that forget the cached layout; called from _PG_init.
void on_load();

}  // namespace idem::key_layout
