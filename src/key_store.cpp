// The executor path to idempotency_keys, and the choice between it and the direct one
// (see key_store.hpp).
#include "key_store.hpp"

#include "key_heap.hpp"
#include "key_layout.hpp"
#include "route.hpp"
#include "pg/catalog.hpp"
#include "pg/errors.hpp"
#include "pg/snapshots.hpp"
#include "pg/spi.hpp"
#include "pg/transactions.hpp"
#include "pg_boundary.hpp"

namespace idem::key_store {
namespace {

// The select list of a KeyRow, in the order of RowColumn, made from the one column list
// (key_row.hpp): the status as "completed?", then each column by its name.
std::string row_columns() {
  std::string list = "status OPERATOR(pg_catalog.=) 'completed'";
  for (int number = kRowStatus + 1; number <= kRowColumnCount; ++number)
    list += std::string(", ") + kColumns[kRowColumnSource[number]].name;
  return list;
}
// The type of RowColumn `number` in that select list: a result of another shape is refused
// before a value of it is read (a statement re-planned against something else must never have
// its values taken for ours).
constexpr Oid row_column_type(int number) {
  return number == kRowStatus ? BOOLOID : kColumns[kRowColumnSource[number]].type;
}
// A key is (owner, scope, key), the owner being the claiming role's name: $1 scope, $2 key, and
// the owner where each statement has it.
constexpr const char* kWhereKey =
    "scope OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2";
constexpr const char* kAndOwner3 = " AND owner OPERATOR(pg_catalog.=) $3";
// The fence of complete / release / checkpoint: the token holds a live processing row of
// the same owner ($5 is "now" in all three statements). The direct completion states it in
// C++ (key_heap_write.cpp, holds); test/pgtap/completion_fence.sql proves the two equal.
constexpr const char* kWhereHolder =
    " AND lease_token OPERATOR(pg_catalog.=) $3 AND owner OPERATOR(pg_catalog.=) $4"
    " AND status OPERATOR(pg_catalog.=) 'processing' AND expires_at OPERATOR(pg_catalog.>) $5";
// The row is the caller's (key_row.hpp, belongs_to): unstamped, stamped in another cluster, or
// stamped with the caller's OID ($oid) in this one ($system). Every fenced statement also
// stamps the row it changes, so that a row adopted by name is the caller's from then on.
std::string owned_by(const std::string& oid, const std::string& system) {
  return " AND (owner_system IS NULL OR owner_oid IS NULL OR owner_system "
         "OPERATOR(pg_catalog.<>) " +
         system + " OR owner_oid OPERATOR(pg_catalog.=) " + oid + ")";
}
std::string stamp(const std::string& oid, const std::string& system) {
  return ", owner_oid = " + oid + ", owner_system = " + system;
}

enum PlanId {
  kFind,
  kLock,
  kLook,
  kDelete,
  kInsert,
  kRestart,
  kReclaim,
  kComplete,
  kRelease,
  kCheckpoint,
  kPlanCount
};

struct PlanSpec {
  std::string sql;
  std::vector<Oid> argument_types;
};

// The statements that write a claim's values: $1 scope, $2 key, $3 owner, $4 fingerprint,
// $5 ttl, $6 now, $7 expires_at, $8 token, $9 locked_until, $10 lease, $11 owner_oid,
// $12 owner_system (the caller's stamp, written on every claim).
PlanSpec claim_statement(PlanId id, const std::string& table, const std::string& returning) {
  const std::vector<Oid> claim_types = {TEXTOID,        TEXTOID,        TEXTOID,        BYTEAOID,
                                        INTERVALOID,    TIMESTAMPTZOID, TIMESTAMPTZOID, UUIDOID,
                                        TIMESTAMPTZOID, INTERVALOID,    OIDOID,         INT8OID};
  switch (id) {
    case kInsert:
      return {"INSERT INTO " + table +
                  " (owner, scope, key, fingerprint, attempts, ttl, lease, created_at, expires_at,"
                  " lease_token, locked_until, status, updated_at, owner_oid, owner_system)"
                  " VALUES ($3, $1, $2, $4, 1, $5, $10, $6, $7, $8, $9, 'processing', $6, $11, $12)"
                  " ON CONFLICT (owner, scope, key) DO NOTHING",
              claim_types};
    case kRestart:
      return {"UPDATE " + table +
                  " SET fingerprint = $4, attempts = 1, ttl = $5, lease = $10, created_at = $6,"
                  " expires_at = $7, lease_token = $8, locked_until = $9, recovery_point = NULL,"
                  " status = 'processing', response_code = NULL, updated_at = $6, response = NULL,"
                  " response_body = NULL, response_headers = NULL, response_expires_at = NULL" +
                  stamp("$11", "$12") + " WHERE " + kWhereKey + kAndOwner3,
              claim_types};
    case kReclaim:
      return {"UPDATE " + table +
                  " SET fingerprint = COALESCE(fingerprint, $4),"
                  " attempts = attempts OPERATOR(pg_catalog.+) 1, ttl = $5, lease = $10,"
                  " expires_at = $7, lease_token = $8, locked_until = $9, updated_at = $6" +
                  stamp("$11", "$12") + " WHERE " + kWhereKey + kAndOwner3 + returning,
              claim_types};
    default:
      throw Error(ERRCODE_INTERNAL_ERROR, "unknown claim statement");
  }
}

// The statements fenced by the holder's token: $1 scope, $2 key, $3 token, $4 owner, $5 now,
// then their own values, then the caller's stamp (owner_oid, owner_system).
PlanSpec fenced_statement(PlanId id, const std::string& table, const std::string& returning) {
  const std::string fence = std::string(kWhereKey) + kWhereHolder;
  switch (id) {
    case kComplete:
      // Columns at the end of the row change, and expires_at moves to the completion time +
      // ttl (SPEC section 2): an update whose WAL record stays small.
      return {"UPDATE " + table +
                  " SET status = 'completed', response_code = $7, updated_at = $5, response = $6,"
                  " expires_at = $8, response_body = $9, response_headers = $10,"
                  " response_expires_at = $13" +
                  stamp("$11", "$12") + " WHERE " + fence + owned_by("$11", "$12") + returning,
              {TEXTOID, TEXTOID, UUIDOID, TEXTOID, TIMESTAMPTZOID, JSONBOID, INT4OID,
               TIMESTAMPTZOID, BYTEAOID, JSONBOID, OIDOID, INT8OID, TIMESTAMPTZOID}};
    case kRelease:
      return {"UPDATE " + table + " SET lease_token = NULL, locked_until = NULL, updated_at = $5" +
                  stamp("$6", "$7") + " WHERE " + fence + owned_by("$6", "$7"),
              {TEXTOID, TEXTOID, UUIDOID, TEXTOID, TIMESTAMPTZOID, OIDOID, INT8OID}};
    case kCheckpoint:
      return {"UPDATE " + table +
                  " SET recovery_point = $6, locked_until = $7,"
                  " expires_at = GREATEST(expires_at, $7), updated_at = $5" +
                  stamp("$8", "$9") + " WHERE " + fence + owned_by("$8", "$9"),
              {TEXTOID, TEXTOID, UUIDOID, TEXTOID, TIMESTAMPTZOID, TEXTOID, TIMESTAMPTZOID, OIDOID,
               INT8OID}};
    default:
      throw Error(ERRCODE_INTERNAL_ERROR, "unknown fenced statement");
  }
}

// After a look's columns, what the row's xmax tells (Session::look): xmax, the system
// identifier of the node that holds the row, and whether xmax is in progress there and not of
// the transaction reading it, both computed on that node. Where Citus runs a call it did not
// delegate, the row comes from a worker and its xmax is a worker's transaction id, which means
// nothing here. xmax is widened to that node's xid8 by the epoch of its next transaction id.
constexpr const char* kLookNodeColumns =
    ", xmax, (pg_catalog.pg_control_system()).system_identifier,"
    " CASE WHEN xmax = '0'::xid"
    " OR xmax = pg_catalog.xid(pg_catalog.pg_current_xact_id_if_assigned()) THEN false"
    " ELSE coalesce(pg_catalog.pg_xact_status(((("
    "(pg_catalog.pg_snapshot_xmax(pg_catalog.pg_current_snapshot())::text::int8 >> 32) << 32)"
    " | xmax::text::int8) - CASE WHEN (((pg_catalog.pg_snapshot_xmax("
    "pg_catalog.pg_current_snapshot())::text::int8 >> 32) << 32) | xmax::text::int8)"
    " > pg_catalog.pg_snapshot_xmax(pg_catalog.pg_current_snapshot())::text::int8 + 2147483648"
    " THEN 4294967296 ELSE 0 END)::text::xid8) = 'in progress', false) END";

PlanSpec spec_of(PlanId id, const std::string& table) {
  const std::string columns = row_columns();
  const std::string select =
      std::string("SELECT ") + columns + " FROM " + table + " WHERE " + kWhereKey + kAndOwner3;
  const std::string returning = " RETURNING " + columns;
  const std::vector<Oid> key_types = {TEXTOID, TEXTOID, TEXTOID};
  switch (id) {
    case kFind:
      return {select, key_types};
    case kLock:
      return {select + " FOR UPDATE SKIP LOCKED", key_types};
    case kLook:
      return {std::string("SELECT ") + columns + kLookNodeColumns + " FROM " + table + " WHERE " +
                  kWhereKey + kAndOwner3,
              key_types};
    case kDelete:
      return {"DELETE FROM " + table + " WHERE " + kWhereKey + kAndOwner3, key_types};
    case kInsert:
    case kRestart:
    case kReclaim:
      return claim_statement(id, table, returning);
    default:
      return fenced_statement(id, table, returning);
  }
}

// Plans prepared once per backend for the table they were made for. A different table
// OID (the extension was dropped and created again) makes them all stale.
struct PlanCache {
  Oid table = InvalidOid;
  std::array<SPIPlanPtr, kPlanCount> plans{};
};
PlanCache cache;

// The statements hold the OIDs of the key_status labels they name: ALTER TYPE ... RENAME
// VALUE must make them parse again (and fail if 'processing' or 'completed' is gone).
void forget_plans(Datum, SyscacheId, uint32) {
  cache.table = InvalidOid;
}

// Requires an open SPI connection.
void prepare_plans(Oid table) {
  for (SPIPlanPtr& plan : cache.plans) {
    if (plan != nullptr) pg::spi::free_plan(plan);
    plan = nullptr;
  }
  cache.table = InvalidOid;
  // A 1.0 / 1.1 table (Citus, or a hook that keeps the direct path off) gets the direct
  // path's 55000, not a statement's error about a column it lacks.
  if (pg::catalog::column_type(table, "owner") == REGROLEOID) key_layout::reject_old_table();
  if (!pg::catalog::has_column(table, "owner_oid")) key_layout::reject_unstamped_table();
  const std::string name = qualified_name(table);
  for (int id = 0; id < kPlanCount; ++id) {
    PlanSpec spec = spec_of(static_cast<PlanId>(id), name);
    SPIPlanPtr plan = pg::spi::prepare_kept(
        spec.sql.c_str(), static_cast<int>(spec.argument_types.size()), spec.argument_types.data());
    if (plan == nullptr)
      throw Error(ERRCODE_INTERNAL_ERROR, "could not prepare a statement on idempotency_keys",
                  SPI_result_code_string(SPI_result));
    cache.plans[id] = plan;
  }
  cache.table = table;
}

// Runs a prepared statement; returns the number of rows it processed. The caller's memory
// context stays current (SPI leaves its own procedure context current after every call, where
// whatever the caller allocates next would pile up until SPI_finish).
uint64 run(PlanId id, Datum* values, const char* nulls, bool read_only, long limit) {
  // The previous result was decoded (copied) already: free it, or a batch's results would
  // pile up in the SPI connection's memory until it closes.
  pg::spi::free_result();
  const int rc = pg::spi::execute_plan(cache.plans[id], values, nulls, read_only, limit);
  if (rc < 0)
    throw Error(ERRCODE_INTERNAL_ERROR, "idempotency_keys statement failed",
                SPI_result_code_string(rc));
  return SPI_processed;
}

// Where the row of a look lives, and what its xmax means there (spec_of, kLook).
struct RowNode {
  TransactionId xmax = InvalidTransactionId;
  int64 system_identifier = 0;
  bool xmax_in_progress_there = false;  // in progress, and not the reader's transaction
};

// Copies row `index` of the last SPI result into `context`. `node`: the statement (kLook)
// selects the row's xmax, its node's system identifier and that node's verdict on xmax after
// its columns, stored there.
KeyRow decode(uint64 index, MemoryContext context, RowNode* node = nullptr) {
  HeapTuple tuple = SPI_tuptable->vals[index];
  TupleDesc desc = SPI_tuptable->tupdesc;
  const int extra = node != nullptr ? 3 : 0;
  bool shaped = desc->natts == kRowColumnCount + extra &&
                (extra == 0 || (TupleDescAttr(desc, kRowColumnCount)->atttypid == XIDOID &&
                                TupleDescAttr(desc, kRowColumnCount + 1)->atttypid == INT8OID &&
                                TupleDescAttr(desc, kRowColumnCount + 2)->atttypid == BOOLOID));
  for (int number = kRowStatus; shaped && number <= kRowColumnCount; ++number)
    shaped = TupleDescAttr(desc, number - 1)->atttypid == row_column_type(number);
  if (!shaped)
    throw Error(ERRCODE_DATATYPE_MISMATCH,
                "a statement on idempotency_keys returned columns of unexpected types", {},
                "Drop and create the extension idempotency again.");
  auto column = [&](int number, bool* is_null) {
    return pg::spi::column_unchecked(tuple, desc, number, is_null);
  };
  bool is_null = false;
  if (node != nullptr) {
    Datum raw = column(kRowColumnCount + 1, &is_null);
    node->xmax = is_null ? InvalidTransactionId : DatumGetTransactionId(raw);
    raw = column(kRowColumnCount + 2, &is_null);
    node->system_identifier = is_null ? 0 : DatumGetInt64(raw);
    raw = column(kRowColumnCount + 3, &is_null);
    node->xmax_in_progress_there = !is_null && DatumGetBool(raw);
  }
  return decode_columns(column, DatumGetBool(column(1, &is_null)), context);
}

Datum nullable(const void* pointer) {
  return PointerGetDatum(pointer);
}
char null_flag(const void* pointer) {
  return pointer == nullptr ? 'n' : ' ';
}

// The same version of a key: any write of a claim, completion, release, checkpoint or take-over
// changes one of these.
bool same_version(const std::optional<KeyRow>& a, const std::optional<KeyRow>& b) {
  if (!a || !b) return !a && !b;
  const bool same_token =
      a->lease_token.has_value() == b->lease_token.has_value() &&
      (!a->lease_token || memcmp(a->lease_token->data, b->lease_token->data, UUID_LEN) == 0);
  return a->completed == b->completed && same_token && a->locked_until == b->locked_until &&
         a->attempts == b->attempts && a->created_at == b->created_at &&
         a->expires_at == b->expires_at;
}

}  // namespace

std::string qualified_name(Oid table) {
  return pg::catalog::qualified_relation_name(table);
}

void on_load() {
  pg::catalog::on_syscache_change(ENUMOID, forget_plans);
}

Session::Session(Oid table, caller::ActingAsOwner& acting)
    : caller_context_(CurrentMemoryContext),
      open_table_(table, route::Route::of_call()),
      acting_(acting) {}

void Session::connect() {
  if (connected_) return;
  acting_.pin_search_path();
  if (!pg::spi::connect()) throw Error(ERRCODE_INTERNAL_ERROR, "SPI_connect failed");
  connected_ = true;
  if (cache.table != open_table_.oid()) prepare_plans(open_table_.oid());
}

uint64 Session::execute(int plan, Datum* values, const char* nulls, bool read_only, long limit) {
  connect();
  return run(static_cast<PlanId>(plan), values, nulls, read_only, limit);
}

Session::~Session() {
  // An unfinished session means an exception is on its way to sql_entry(), which raises
  // an ERROR: transaction (or subtransaction) abort then closes the SPI connection.
}

void Session::finish() {
  if (finished_) return;
  finished_ = true;
  open_table_.close();
  if (connected_) pg::spi::finish();
}

std::optional<KeyRow> Session::peek(text* owner, text* scope, text* key, bool* absent, Read read) {
  *absent = false;
  const bool after_wait = read == Read::kLatest;
  if (!open_table_.route().direct_reads()) {
    // At READ COMMITTED every look takes a new snapshot, as the direct look decides an
    // undecided version with one.
    std::optional<KeyRow> row =
        find(owner, scope, key, IsolationUsesXactSnapshot() ? read : Read::kLatest);
    // A snapshot transaction that waited, reading through the executor: it would never see
    // the holder's end, so where a version committed after its snapshot exists it gets 40001
    // (as the direct look raises it) instead of sleeping out its wait; the key is read again
    // as of now. A first look answers as a SELECT would. This transaction's own writes are no
    // conflict and need no exception: both reads see them alike (same command id, and a
    // version of the current transaction is judged by command id alone).
    if (after_wait && IsolationUsesXactSnapshot() && ActiveSnapshotSet()) {
      const std::optional<KeyRow> now = find(owner, scope, key, Read::kNow);
      if (!same_version(row, now)) pg::errors::committed_after_snapshot(key);
    }
    return row;
  }
  std::optional<KeyRow> row;
  switch (key_heap::look(open_table_, owner, scope, key, caller_context_, &row)) {
    case key_heap::Seen::kNothing:
      *absent = true;
      break;
    case key_heap::Seen::kRow:
      break;
    case key_heap::Seen::kUndecided:
      return key_heap::find(open_table_, owner, scope, key, caller_context_, Read::kLatest);
  }
  // The dirty look takes no predicate lock; under SERIALIZABLE the same row (or the absence
  // of one) is read again by an MVCC probe that takes them, as a SELECT would.
  if (IsolationIsSerializable())
    row = key_heap::find(open_table_, owner, scope, key, caller_context_, Read::kStatement);
  return row;
}

std::optional<KeyRow> Session::find(text* owner, text* scope, text* key, Read read) {
  Datum values[] = {PointerGetDatum(scope), PointerGetDatum(key), PointerGetDatum(owner)};
  if (read == Read::kNow) return find_as_of_now(values);
  // read_only: SPI runs the statement with the active snapshot (the statement's); else with a
  // new one (at READ COMMITTED; the transaction's own at the snapshot levels).
  bool read_only = read == Read::kStatement && ActiveSnapshotSet();
  if (execute(kFind, values, nullptr, read_only, 1) == 0) return std::nullopt;
  return decode(0, caller_context_);
}

std::optional<KeyRow> Session::find_as_of_now(Datum* values) {
  connect();
  // The latest snapshot with the current command id: it sees this transaction's own writes of
  // earlier commands as the look it is compared with does (an earlier element of the same
  // batch, or an earlier call in the same statement, claimed the key), so that they are never
  // taken for another transaction's commit.
  pg::snapshots::push_latest();
  // read_only: SPI runs the statement with the active snapshot, the one pushed here. An error
  // leaves it to transaction abort, which pops every snapshot.
  const uint64 found = run(kFind, values, nullptr, true, 1);
  std::optional<KeyRow> row;
  if (found > 0) row = decode(0, caller_context_);
  pg::snapshots::pop_active();
  return row;
}

std::optional<KeyRow> Session::lock(text* owner, text* scope, text* key) {
  Datum values[] = {PointerGetDatum(scope), PointerGetDatum(key), PointerGetDatum(owner)};
  if (execute(kLock, values, nullptr, false, 1) == 0) return std::nullopt;
  return decode(0, caller_context_);
}

Session::Look Session::look(text* owner, text* scope, text* key,
                            const key_lock::KeyIdentity& identity) {
  Look result;
  // The superuser's switch idempotency.executor_path sends this read through the executor
  // too, so that the tests of the executor path cover what Citus and the executor hooks use.
  if (open_table_.route().direct_looks()) {
    result.held_by_open_transaction =
        key_heap::written_by_open_transaction(open_table_, owner, scope, key);
    result.row = key_heap::find(open_table_, owner, scope, key, caller_context_, Read::kLatest);
    return result;
  }
  Datum values[] = {PointerGetDatum(scope), PointerGetDatum(key), PointerGetDatum(owner)};
  // Read::kLatest (as peek() after waiting): not read_only, so SPI takes a new snapshot at READ
  // COMMITTED, the transaction's own in a snapshot transaction.
  if (execute(kLook, values, nullptr, false, 1) > 0) {
    RowNode node;
    result.row = decode(0, caller_context_, &node);
    // An xmax of a transaction still open (not ours): it updates, deletes or has locked the
    // row (a take-over, a completion, a release, forget_key). The table's rows are locked only
    // by FOR UPDATE of one transaction at a time, never shared, so xmax is a transaction id,
    // not a multixact. A row of this node is judged here (our subtransactions too); a row
    // another node sent (a call Citus did not delegate) by that node's verdict.
    if (node.system_identifier != caller::system_identifier()) {
      result.held_by_open_transaction = node.xmax_in_progress_there;
      return result;
    }
    result.held_by_open_transaction = pg::transactions::open_other(node.xmax);
    return result;
  }
  // No row visible: an executor-path claim of another open transaction holds the key lock.
  switch (key_lock::try_lock(identity)) {
    case key_lock::Outcome::kBusy:
      result.held_by_open_transaction = true;
      break;
    case key_lock::Outcome::kAcquired:
      key_lock::unlock(identity);
      break;
    case key_lock::Outcome::kAlreadyHeld:
      break;
  }
  return result;
}

bool Session::remove(text* owner, text* scope, text* key) {
  Datum values[] = {PointerGetDatum(scope), PointerGetDatum(key), PointerGetDatum(owner)};
  return execute(kDelete, values, nullptr, false, 0) == 1;
}

namespace {
void claim_parameters(text* scope, text* key, const ClaimValues& claim, Datum* values,
                      char* nulls) {
  values[0] = PointerGetDatum(scope);
  values[1] = PointerGetDatum(key);
  values[2] = PointerGetDatum(claim.owner);
  values[3] = nullable(claim.fingerprint);
  nulls[3] = null_flag(claim.fingerprint);
  values[4] = IntervalPGetDatum(&claim.ttl);
  values[5] = TimestampTzGetDatum(claim.now);
  values[6] = TimestampTzGetDatum(claim.expires_at);
  values[7] = UUIDPGetDatum(&claim.token);
  values[8] = TimestampTzGetDatum(claim.locked_until);
  values[9] = IntervalPGetDatum(&claim.lease);
  values[10] = ObjectIdGetDatum(claim.owner_oid);
  values[11] = Int64GetDatum(claim.owner_system);
}
}  // namespace

uint64 Session::execute_claim(int plan, text* scope, text* key, const ClaimValues& claim) {
  Datum values[12];
  char nulls[] = "            ";
  claim_parameters(scope, key, claim, values, nulls);
  return execute(plan, values, nulls, false, 0);
}

Session::Insert Session::insert_unlocked(text* scope, text* key, const ClaimValues& claim,
                                         RowAddress* where, bool known_absent) {
  *where = kNowhere;
  if (!open_table_.route().may_write_directly()) return Insert::kNeedsLock;
  switch (key_heap::insert(open_table_, scope, key, claim, where, known_absent)) {
    case key_heap::InsertResult::kInserted:
      return Insert::kInserted;
    case key_heap::InsertResult::kExists:
      return Insert::kExists;
    case key_heap::InsertResult::kBusy:
      return Insert::kBusy;
    case key_heap::InsertResult::kNeedsExecutor:
      break;
  }
  return Insert::kNeedsLock;
}

bool Session::insert(text* scope, text* key, const ClaimValues& claim, RowAddress* where) {
  *where = kNowhere;
  return execute_claim(kInsert, scope, key, claim) == 1;
}

void Session::restart(text* scope, text* key, const ClaimValues& claim) {
  if (execute_claim(kRestart, scope, key, claim) != 1)
    throw Error(ERRCODE_INTERNAL_ERROR, "a locked idempotency key disappeared");
}

KeyRow Session::reclaim(text* scope, text* key, const ClaimValues& claim) {
  if (execute_claim(kReclaim, scope, key, claim) != 1)
    throw Error(ERRCODE_INTERNAL_ERROR, "a locked idempotency key disappeared");
  return decode(0, caller_context_);
}

std::optional<KeyRow> Session::complete(text* scope, text* key, const pg_uuid_t& token,
                                        const Owner& owner, const Outcome& outcome, TimestampTz now,
                                        TimestampTz expires_at, const RowAddress& where) {
  if (where.valid() && open_table_.route().may_write_directly()) {
    if (std::optional<KeyRow> row = key_heap::complete(open_table_, where, scope, key, token, owner,
                                                       outcome, now, expires_at, caller_context_))
      return row;
  }
  Datum values[] = {PointerGetDatum(scope),
                    PointerGetDatum(key),
                    UUIDPGetDatum(&token),
                    PointerGetDatum(owner.name),
                    TimestampTzGetDatum(now),
                    nullable(outcome.response),
                    Int32GetDatum(outcome.response_code.value_or(0)),
                    TimestampTzGetDatum(expires_at),
                    nullable(outcome.response_body),
                    nullable(outcome.response_headers),
                    ObjectIdGetDatum(owner.role),
                    Int64GetDatum(owner.system),
                    TimestampTzGetDatum(outcome.response_expires_at.value_or(0))};
  char nulls[] = "             ";
  nulls[12] = outcome.response_expires_at ? ' ' : 'n';
  nulls[5] = null_flag(outcome.response);
  nulls[6] = outcome.response_code ? ' ' : 'n';
  nulls[8] = null_flag(outcome.response_body);
  nulls[9] = null_flag(outcome.response_headers);
  if (execute(kComplete, values, nulls, false, 0) != 1) return std::nullopt;
  return decode(0, caller_context_);
}

bool Session::release(text* scope, text* key, const pg_uuid_t& token, const Owner& owner,
                      TimestampTz now) {
  Datum values[] = {PointerGetDatum(scope),     PointerGetDatum(key),
                    UUIDPGetDatum(&token),      PointerGetDatum(owner.name),
                    TimestampTzGetDatum(now),   ObjectIdGetDatum(owner.role),
                    Int64GetDatum(owner.system)};
  return execute(kRelease, values, nullptr, false, 0) == 1;
}

bool Session::checkpoint(text* scope, text* key, const pg_uuid_t& token, const Owner& owner,
                         text* recovery_point, TimestampTz now, TimestampTz locked_until) {
  Datum values[] = {PointerGetDatum(scope),
                    PointerGetDatum(key),
                    UUIDPGetDatum(&token),
                    PointerGetDatum(owner.name),
                    TimestampTzGetDatum(now),
                    nullable(recovery_point),
                    TimestampTzGetDatum(locked_until),
                    ObjectIdGetDatum(owner.role),
                    Int64GetDatum(owner.system)};
  char nulls[] = "         ";
  nulls[5] = null_flag(recovery_point);
  return execute(kCheckpoint, values, nulls, false, 0) == 1;
}

}  // namespace idem::key_store
