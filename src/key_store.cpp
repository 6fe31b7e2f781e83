// The executor path to idempotency_keys (see key_store.hpp).
#include "key_store.hpp"

#include "pg_boundary.hpp"

namespace idem::key_store {
namespace {

constexpr const char* kRowColumns =
    "status OPERATOR(pg_catalog.=) 'completed', owner, fingerprint, response, response_code, "
    "recovery_point, lease_token, locked_until, attempts, ttl, created_at, expires_at";
constexpr const char* kWhereKey =
    "scope OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2";
// The fence of complete / release / checkpoint: the token holds a live processing row of
// the same owner ($5 is "now" in all three statements).
constexpr const char* kWhereHolder =
    " AND lease_token OPERATOR(pg_catalog.=) $3 AND owner OPERATOR(pg_catalog.=) $4"
    " AND status OPERATOR(pg_catalog.=) 'processing' AND expires_at OPERATOR(pg_catalog.>) $5";

enum PlanId {
  kFind,
  kLock,
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

PlanSpec spec_of(PlanId id, const std::string& table) {
  const std::string select =
      std::string("SELECT ") + kRowColumns + " FROM " + table + " WHERE " + kWhereKey;
  const std::string returning = std::string(" RETURNING ") + kRowColumns;
  const std::string fence = std::string(kWhereKey) + kWhereHolder;
  // Parameters of a claim: $1 scope, $2 key, $3 owner, $4 fingerprint, $5 ttl, $6 now,
  // $7 expires_at, $8 token, $9 locked_until.
  const std::vector<Oid> claim_types = {TEXTOID,        TEXTOID,     REGROLEOID,
                                        BYTEAOID,       INTERVALOID, TIMESTAMPTZOID,
                                        TIMESTAMPTZOID, UUIDOID,     TIMESTAMPTZOID};
  const std::vector<Oid> fence_types = {TEXTOID, TEXTOID, UUIDOID, REGROLEOID, TIMESTAMPTZOID};
  switch (id) {
    case kFind:
      return {select, {TEXTOID, TEXTOID}};
    case kLock:
      return {select + " FOR UPDATE SKIP LOCKED", {TEXTOID, TEXTOID}};
    case kInsert:
      return {"INSERT INTO " + table +
                  " (scope, key, owner, fingerprint, attempts, ttl, created_at, expires_at,"
                  " lease_token, locked_until, status, updated_at)"
                  " VALUES ($1, $2, $3, $4, 1, $5, $6, $7, $8, $9, 'processing', $6)"
                  " ON CONFLICT (scope, key) DO NOTHING",
              claim_types};
    case kRestart:
      return {"UPDATE " + table +
                  " SET owner = $3, fingerprint = $4, attempts = 1, ttl = $5, created_at = $6,"
                  " expires_at = $7, lease_token = $8, locked_until = $9, recovery_point = NULL,"
                  " status = 'processing', response_code = NULL, updated_at = $6, response = NULL"
                  " WHERE " +
                  kWhereKey,
              claim_types};
    case kReclaim:
      return {"UPDATE " + table +
                  " SET fingerprint = COALESCE(fingerprint, $4),"
                  " attempts = attempts OPERATOR(pg_catalog.+) 1, ttl = $5, expires_at = $7,"
                  " lease_token = $8, locked_until = $9, updated_at = $6"
                  " WHERE " +
                  kWhereKey + " AND owner OPERATOR(pg_catalog.=) $3" + returning,
              claim_types};
    case kComplete:
      // Only columns at the end of the row change (and expires_at keeps its value in the
      // inbox pattern): a small, usually HOT, update.
      return {"UPDATE " + table +
                  " SET status = 'completed', response_code = $7, updated_at = $5, response = $6,"
                  " expires_at = $8 WHERE " +
                  fence + returning,
              {TEXTOID, TEXTOID, UUIDOID, REGROLEOID, TIMESTAMPTZOID, JSONBOID, INT4OID,
               TIMESTAMPTZOID}};
    case kRelease:
      return {"UPDATE " + table +
                  " SET lease_token = NULL, locked_until = NULL, updated_at = $5 WHERE " + fence,
              fence_types};
    case kCheckpoint:
      return {"UPDATE " + table +
                  " SET recovery_point = $6, locked_until = $7,"
                  " expires_at = GREATEST(expires_at, $7), updated_at = $5 WHERE " +
                  fence,
              {TEXTOID, TEXTOID, UUIDOID, REGROLEOID, TIMESTAMPTZOID, TEXTOID, TIMESTAMPTZOID}};
    default:
      throw Error(ERRCODE_INTERNAL_ERROR, "unknown statement");
  }
}

// Plans prepared once per backend for the table they were made for. A different table
// OID (the extension was dropped and created again) makes them all stale.
struct PlanCache {
  Oid table = InvalidOid;
  std::array<SPIPlanPtr, kPlanCount> plans{};
};
PlanCache cache;

// Requires an open SPI connection.
void prepare_plans(Oid table) {
  for (SPIPlanPtr& plan : cache.plans) {
    if (plan != nullptr) pg_call([&] { SPI_freeplan(plan); });
    plan = nullptr;
  }
  cache.table = InvalidOid;
  const std::string name = qualified_name(table);
  for (int id = 0; id < kPlanCount; ++id) {
    PlanSpec spec = spec_of(static_cast<PlanId>(id), name);
    SPIPlanPtr plan = pg_call([&] {
      return SPI_prepare_cursor(spec.sql.c_str(), static_cast<int>(spec.argument_types.size()),
                                spec.argument_types.data(), CURSOR_OPT_GENERIC_PLAN);
    });
    if (plan == nullptr)
      throw Error(ERRCODE_INTERNAL_ERROR, "could not prepare a statement on idempotency_keys",
                  SPI_result_code_string(SPI_result));
    pg_call([&] { SPI_keepplan(plan); });
    cache.plans[id] = plan;
  }
  cache.table = table;
}

// Runs a prepared statement; returns the number of rows it processed.
uint64 run(PlanId id, Datum* values, const char* nulls, bool read_only, long limit) {
  int rc =
      pg_call([&] { return SPI_execute_plan(cache.plans[id], values, nulls, read_only, limit); });
  if (rc < 0)
    throw Error(ERRCODE_INTERNAL_ERROR, "idempotency_keys statement failed",
                SPI_result_code_string(rc));
  return SPI_processed;
}

// Builds a KeyRow from the columns of kRowColumns (2..12; column 1, the status, is passed
// as `completed`), copying varlena values into `context` so they outlive the scan.
template <typename ColumnReader>
KeyRow decode_columns(ColumnReader&& column, bool completed, MemoryContext context) {
  auto copy_varlena = [&](int number) -> struct varlena* {
    bool is_null = false;
    Datum value = column(number, &is_null);
    if (is_null) return nullptr;
    return pg_call([&] {
      MemoryContext old = MemoryContextSwitchTo(context);
      struct varlena* copy = PG_DETOAST_DATUM_COPY(value);
      MemoryContextSwitchTo(old);
      return copy;
    });
  };
  KeyRow row{};
  bool is_null = false;
  row.completed = completed;
  row.owner = DatumGetObjectId(column(2, &is_null));
  row.fingerprint = reinterpret_cast<bytea*>(copy_varlena(3));
  row.response = reinterpret_cast<Jsonb*>(copy_varlena(4));
  Datum code = column(5, &is_null);
  if (!is_null) row.response_code = DatumGetInt32(code);
  row.recovery_point = reinterpret_cast<text*>(copy_varlena(6));
  Datum token = column(7, &is_null);
  if (!is_null) row.lease_token = *DatumGetUUIDP(token);
  Datum locked_until = column(8, &is_null);
  if (!is_null) row.locked_until = DatumGetTimestampTz(locked_until);
  row.attempts = DatumGetInt32(column(9, &is_null));
  row.ttl = *DatumGetIntervalP(column(10, &is_null));
  row.created_at = DatumGetTimestampTz(column(11, &is_null));
  row.expires_at = DatumGetTimestampTz(column(12, &is_null));
  return row;
}

// Copies row `index` of the last SPI result into `context`.
KeyRow decode(uint64 index, MemoryContext context) {
  HeapTuple tuple = SPI_tuptable->vals[index];
  TupleDesc desc = SPI_tuptable->tupdesc;
  auto column = [&](int number, bool* is_null) {
    return SPI_getbinval(tuple, desc, number, is_null);
  };
  bool is_null = false;
  return decode_columns(column, DatumGetBool(column(1, &is_null)), context);
}

// --- The direct read path ---------------------------------------------------------------
//
// A profile of claim_key showed the SPI SELECT of the first look costing about a sixth of
// a whole new-key transaction (executor start-up and shutdown around one index probe).
// The first look therefore probes the primary key directly with the statement's snapshot:
// one B-Tree descent and a heap fetch. Everything that decides or writes still goes
// through the executor, so correctness never depends on this path. Under Citus the local
// table is an empty shell (the rows live in shards), so there the first look uses SPI.

constexpr const char* kProbeColumns[] = {
    "status",      "owner",        "fingerprint", "response", "response_code", "recovery_point",
    "lease_token", "locked_until", "attempts",    "ttl",      "created_at",    "expires_at"};
constexpr int kProbeColumnCount = 12;

struct ProbeLayout {
  Oid table = InvalidOid;
  Oid primary_key = InvalidOid;
  AttrNumber attnums[kProbeColumnCount] = {};
  Oid completed_label = InvalidOid;
};
ProbeLayout probe_layout;

void load_probe_layout(Oid table) {
  probe_layout.table = InvalidOid;
  pg_call([&] {
    Relation relation = table_open(table, AccessShareLock);
#if PG_VERSION_NUM >= 180000
    probe_layout.primary_key = RelationGetPrimaryKeyIndex(relation, false);
#else
    probe_layout.primary_key = RelationGetPrimaryKeyIndex(relation);
#endif
    table_close(relation, NoLock);
    for (int i = 0; i < kProbeColumnCount; ++i)
      probe_layout.attnums[i] = get_attnum(table, kProbeColumns[i]);
    Oid status_type = get_atttype(table, probe_layout.attnums[0]);
    probe_layout.completed_label =
        GetSysCacheOid2(ENUMTYPOIDNAME, Anum_pg_enum_oid, ObjectIdGetDatum(status_type),
                        CStringGetDatum("completed"));
  });
  for (AttrNumber attnum : probe_layout.attnums)
    if (attnum == InvalidAttrNumber)
      throw Error(ERRCODE_UNDEFINED_COLUMN, "idempotency_keys lacks a column of this version");
  if (!OidIsValid(probe_layout.primary_key) || !OidIsValid(probe_layout.completed_label))
    throw Error(ERRCODE_UNDEFINED_OBJECT, "idempotency_keys lacks its primary key or status type");
  probe_layout.table = table;
}

// Citus routes statements to shards through the planner; a direct read would see the
// coordinator's empty shell table.
bool direct_reads_possible() {
  return GetConfigOption("citus.version", true, false) == nullptr;
}

// Pointers to a probe's open objects, closed by close_probe (also on the error path).
struct Probe {
  Relation table = nullptr;
  Relation index = nullptr;
  IndexScanDesc scan = nullptr;
  TupleTableSlot* slot = nullptr;
};

void close_probe(Probe& probe) {
  if (probe.scan != nullptr) index_endscan(probe.scan);
  if (probe.slot != nullptr) ExecDropSingleTupleTableSlot(probe.slot);
  if (probe.index != nullptr) index_close(probe.index, NoLock);
  if (probe.table != nullptr) table_close(probe.table, NoLock);
  probe = Probe{};
}

Datum nullable(const void* pointer) {
  return PointerGetDatum(pointer);
}
char null_flag(const void* pointer) {
  return pointer == nullptr ? 'n' : ' ';
}

}  // namespace

Oid table_of(Oid function) {
  Oid table = pg_call([&] {
    Oid schema = get_func_namespace(function);
    return OidIsValid(schema) ? get_relname_relid("idempotency_keys", schema) : InvalidOid;
  });
  if (!OidIsValid(table))
    throw Error(ERRCODE_UNDEFINED_TABLE,
                "idempotency_keys does not exist in the extension's schema", {},
                "Drop and create the extension idempotency again.");
  return table;
}

std::string qualified_name(Oid table) {
  return pg_call([&] {
    return static_cast<const char*>(quote_qualified_identifier(
        get_namespace_name(get_rel_namespace(table)), get_rel_name(table)));
  });
}

Session::Session(Oid calling_function)
    : caller_context_(CurrentMemoryContext), table_(table_of(calling_function)) {}

void Session::connect() {
  if (connected_) return;
  int rc = pg_call([] { return SPI_connect(); });
  if (rc != SPI_OK_CONNECT) throw Error(ERRCODE_INTERNAL_ERROR, "SPI_connect failed");
  connected_ = true;
  if (cache.table != table_) prepare_plans(table_);
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
  if (!connected_ || finished_) return;
  finished_ = true;
  pg_call([] { SPI_finish(); });
}

std::optional<KeyRow> Session::peek(text* scope, text* key) {
  if (!direct_reads_possible() || !ActiveSnapshotSet()) return find(scope, key, false);
  if (probe_layout.table != table_) load_probe_layout(table_);
  // On an error, transaction abort releases what the probe holds (relations, pins).
  Probe probe;
  bool found = pg_call([&] {
    probe.table = table_open(table_, AccessShareLock);
    probe.index = index_open(probe_layout.primary_key, AccessShareLock);
    ScanKeyData keys[2];
    ScanKeyInit(&keys[0], 1, BTEqualStrategyNumber, F_TEXTEQ, PointerGetDatum(scope));
    ScanKeyInit(&keys[1], 2, BTEqualStrategyNumber, F_TEXTEQ, PointerGetDatum(key));
#if PG_VERSION_NUM >= 180000  // index_beginscan gained an instrumentation argument
    probe.scan = index_beginscan(probe.table, probe.index, GetActiveSnapshot(), nullptr, 2, 0);
#else
    probe.scan = index_beginscan(probe.table, probe.index, GetActiveSnapshot(), 2, 0);
#endif
    index_rescan(probe.scan, keys, 2, nullptr, 0);
    probe.slot = table_slot_create(probe.table, nullptr);
    bool hit = index_getnext_slot(probe.scan, ForwardScanDirection, probe.slot);
    if (hit) slot_getallattrs(probe.slot);
    return hit;
  });
  std::optional<KeyRow> row;
  if (found) {
    auto column = [&](int number, bool* is_null) {
      int index = probe_layout.attnums[number - 1] - 1;
      *is_null = probe.slot->tts_isnull[index];
      return probe.slot->tts_values[index];
    };
    bool is_null = false;
    bool completed = DatumGetObjectId(column(1, &is_null)) == probe_layout.completed_label;
    row = decode_columns(column, completed, caller_context_);
  }
  pg_call([&] { close_probe(probe); });
  return row;
}

std::optional<KeyRow> Session::find(text* scope, text* key, bool fresh_snapshot) {
  Datum values[] = {PointerGetDatum(scope), PointerGetDatum(key)};
  bool read_only = !fresh_snapshot && ActiveSnapshotSet();
  if (execute(kFind, values, nullptr, read_only, 1) == 0) return std::nullopt;
  return decode(0, caller_context_);
}

std::optional<KeyRow> Session::lock(text* scope, text* key) {
  Datum values[] = {PointerGetDatum(scope), PointerGetDatum(key)};
  if (execute(kLock, values, nullptr, false, 1) == 0) return std::nullopt;
  return decode(0, caller_context_);
}

namespace {
void claim_parameters(text* scope, text* key, const ClaimValues& claim, Datum* values,
                      char* nulls) {
  values[0] = PointerGetDatum(scope);
  values[1] = PointerGetDatum(key);
  values[2] = ObjectIdGetDatum(claim.owner);
  values[3] = nullable(claim.fingerprint);
  nulls[3] = null_flag(claim.fingerprint);
  values[4] = IntervalPGetDatum(&claim.ttl);
  values[5] = TimestampTzGetDatum(claim.now);
  values[6] = TimestampTzGetDatum(claim.expires_at);
  values[7] = UUIDPGetDatum(&claim.token);
  values[8] = TimestampTzGetDatum(claim.locked_until);
}
}  // namespace

uint64 Session::execute_claim(int plan, text* scope, text* key, const ClaimValues& claim) {
  Datum values[9];
  char nulls[] = "         ";
  claim_parameters(scope, key, claim, values, nulls);
  return execute(plan, values, nulls, false, 0);
}

bool Session::insert(text* scope, text* key, const ClaimValues& claim) {
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

std::optional<KeyRow> Session::complete(text* scope, text* key, const pg_uuid_t& token, Oid owner,
                                        const Outcome& outcome, TimestampTz now,
                                        TimestampTz expires_at) {
  Datum values[] = {PointerGetDatum(scope),
                    PointerGetDatum(key),
                    UUIDPGetDatum(&token),
                    ObjectIdGetDatum(owner),
                    TimestampTzGetDatum(now),
                    nullable(outcome.response),
                    Int32GetDatum(outcome.response_code.value_or(0)),
                    TimestampTzGetDatum(expires_at)};
  char nulls[] = "        ";
  nulls[5] = null_flag(outcome.response);
  nulls[6] = outcome.response_code ? ' ' : 'n';
  if (execute(kComplete, values, nulls, false, 0) != 1) return std::nullopt;
  return decode(0, caller_context_);
}

bool Session::release(text* scope, text* key, const pg_uuid_t& token, Oid owner, TimestampTz now) {
  Datum values[] = {PointerGetDatum(scope), PointerGetDatum(key), UUIDPGetDatum(&token),
                    ObjectIdGetDatum(owner), TimestampTzGetDatum(now)};
  return execute(kRelease, values, nullptr, false, 0) == 1;
}

bool Session::checkpoint(text* scope, text* key, const pg_uuid_t& token, Oid owner,
                         text* recovery_point, TimestampTz now, TimestampTz locked_until) {
  Datum values[] = {
      PointerGetDatum(scope),           PointerGetDatum(key),     UUIDPGetDatum(&token),
      ObjectIdGetDatum(owner),          TimestampTzGetDatum(now), nullable(recovery_point),
      TimestampTzGetDatum(locked_until)};
  char nulls[] = "       ";
  nulls[5] = null_flag(recovery_point);
  return execute(kCheckpoint, values, nulls, false, 0) == 1;
}

}  // namespace idem::key_store
