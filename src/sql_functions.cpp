// The single-key SQL functions: claim_key, complete_key, release_key, checkpoint_key, and from
// 1.3 look_key and forget_key. Each
// reads and checks its arguments (arguments.hpp, responses.hpp), runs one step of the claim
// protocol as the installation's owner (claim_protocol.hpp), and returns its answer.
#include "claim_protocol.hpp"
#include "gucs.hpp"
#include "pg/spi.hpp"
#include "pg/srf.hpp"
#include "pg/types.hpp"
#include "responses.hpp"
#include "stats.hpp"

namespace idem::sql_functions {
namespace {

using namespace arguments;  // NOLINT(google-build-using-namespace): the argument readers
using claim_protocol::as_owner;
using claim_protocol::ClaimRequest;
using claim_result::ClaimResult;
using claim_result::Status;
using key_store::KeyRow;
using key_store::Session;

Datum sql_claim_key(FunctionCallInfo fcinfo) {
  const Caller caller = calling("claim_key");
  ClaimRequest request(key_arguments(fcinfo, 0, 2));
  const TimestampTz now = GetCurrentTimestamp();
  request.fingerprint = PG_ARGISNULL(1) ? nullptr : fingerprint_value(PG_GETARG_DATUM(1));
  request.ttl = ttl_argument(fcinfo, 3);
  request.lease = lease_argument(fcinfo, 4);
  request.deadline = wait_deadline(fcinfo, 5, now);
  request.caller = caller;

  const ClaimResult result = as_owner(fcinfo, [&](Session& store, const caller::Installation& at) {
    request.table = at.table;
    return claim_protocol::claim(store, request);
  });
  return claim_result::as_datum(fcinfo, result);
}

Datum sql_complete_key(FunctionCallInfo fcinfo) {
  const Caller caller = calling("complete_key");
  const KeyName name = key_arguments(fcinfo, 0, 4);
  const pg_uuid_t token = token_argument(fcinfo, 1);
  responses::ResponseArguments given;
  if (!PG_ARGISNULL(2)) given.response = PG_GETARG_DATUM(2);
  if (!PG_ARGISNULL(3)) given.code = PG_GETARG_INT32(3);
  if (argument_given(fcinfo, 5)) given.body = PG_GETARG_DATUM(5);
  if (argument_given(fcinfo, 6)) given.headers = PG_GETARG_DATUM(6);
  const key_store::Outcome outcome = responses::outcome_value(given);
  const std::optional<Interval> response_ttl = response_ttl_argument(fcinfo, 7);
  const TimestampTz now = GetCurrentTimestamp();

  const KeyRow completed = as_owner(fcinfo, [&](Session& store, const caller::Installation&) {
    return claim_protocol::complete(store, name, token, outcome, caller, now, response_ttl);
  });
  return claim_result::as_datum(fcinfo,
                                claim_result::stored_answer(Status::kReplay, completed, now));
}

Datum sql_release_key(FunctionCallInfo fcinfo) {
  const Caller caller = calling("release_key");
  const KeyName name = key_arguments(fcinfo, 0, 2);
  const pg_uuid_t token = token_argument(fcinfo, 1);
  const TimestampTz now = GetCurrentTimestamp();
  (void)as_owner(fcinfo, [&](Session& store, const caller::Installation&) {
    claim_protocol::release(store, name, token, caller, now);
    return true;
  });
  stats::count(stats::kReleased);
  PG_RETURN_VOID();
}

Datum sql_checkpoint_key(FunctionCallInfo fcinfo) {
  const Caller caller = calling("checkpoint_key");
  const KeyName name = key_arguments(fcinfo, 0, 3);
  const pg_uuid_t token = token_argument(fcinfo, 1);
  text* recovery_point = recovery_point_argument(fcinfo, 2);
  const TimestampTz now = GetCurrentTimestamp();
  // NULL keeps the lease the claim was made with.
  std::optional<Interval> lease;
  if (!PG_ARGISNULL(4)) lease = lease_argument(fcinfo, 4);
  const TimestampTz locked_until =
      as_owner(fcinfo, [&](Session& store, const caller::Installation&) {
        return claim_protocol::checkpoint(store, name, token, caller, recovery_point, lease, now);
      });
  PG_RETURN_TIMESTAMPTZ(locked_until);
}

// look_key(key, fingerprint, scope): what claim_key would answer now, deciding nothing.
Datum sql_look_key(FunctionCallInfo fcinfo) {
  const Caller caller = calling("look_key");
  const KeyName name = key_arguments(fcinfo, 0, 2);
  const bytea* fingerprint = PG_ARGISNULL(1) ? nullptr : fingerprint_value(PG_GETARG_DATUM(1));
  const TimestampTz now = GetCurrentTimestamp();
  const ClaimResult result = as_owner(fcinfo, [&](Session& store, const caller::Installation& at) {
    return claim_protocol::look(store, name, fingerprint, caller, at.table, now);
  });
  return claim_result::as_datum(fcinfo, result);
}

// forget_key(key, token, scope): deletes the caller's own key; false when there is none.
Datum sql_forget_key(FunctionCallInfo fcinfo) {
  const Caller caller = calling("forget_key");
  const KeyName name = key_arguments(fcinfo, 0, 2);
  std::optional<pg_uuid_t> token;
  if (!PG_ARGISNULL(1)) token = token_argument(fcinfo, 1);
  const TimestampTz now = GetCurrentTimestamp();
  const bool forgotten = as_owner(fcinfo, [&](Session& store, const caller::Installation& at) {
    return claim_protocol::forget(store, name, token, caller, at.table, now);
  });
  PG_RETURN_BOOL(forgotten);
}

// key_policy(): what this session's claims are held to, for an API to publish (the IETF draft
// on the Idempotency-Key header asks resources to publish how long keys are kept).
Datum sql_key_policy(FunctionCallInfo fcinfo) {
  (void)calling("key_policy");
  auto seconds = [](int n) {
    Interval span{};
    span.time = static_cast<int64>(n) * USECS_PER_SEC;
    return span;
  };
  Interval spans[] = {seconds(gucs::default_ttl_seconds), seconds(gucs::max_ttl_seconds),
                      seconds(gucs::default_lease_seconds), seconds(gucs::max_lease_seconds)};
  constexpr int kFields = 6;
  Datum values[kFields];
  bool nulls[kFields] = {};
  for (int i = 0; i < 4; ++i) values[i] = IntervalPGetDatum(&spans[i]);
  values[4] = Int32GetDatum(gucs::max_key_length);
  values[5] = Int32GetDatum(gucs::max_response_size);
  return pg::types::result_row(fcinfo, kFields, values, nulls, "key_policy()");
}

// stuck_holders_rows(): the rows of the view stuck_holders, read as the extension owner (the
// view's readers, pg_monitor, have no right on the key table). A function and not a view over
// the table, so that the table's columns carry no view's dependency. Counts and ages only.
Datum sql_stuck_holders_rows(FunctionCallInfo fcinfo) {
  (void)calling("stuck_holders_rows");
  pg::srf::materialize(fcinfo);
  auto* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);
  const std::optional<caller::Installation> installation = caller::of_database();
  if (!installation) return static_cast<Datum>(0);
  caller::ActingAsOwner acting(*installation);
  const std::string sql =
      "SELECT pg_catalog.current_database(), k.owner, k.scope,"
      " pg_catalog.count(*) FILTER (WHERE k.locked_until OPERATOR(pg_catalog.>) pg_catalog.now()),"
      " pg_catalog.now() OPERATOR(pg_catalog.-) pg_catalog.min(k.created_at),"
      " pg_catalog.count(*) FILTER (WHERE k.locked_until OPERATOR(pg_catalog.<=) pg_catalog.now())"
      " FROM " +
      key_store::qualified_name(installation->table) +
      " k WHERE k.status OPERATOR(pg_catalog.=) 'processing' AND k.lease_token IS NOT NULL"
      " AND k.expires_at OPERATOR(pg_catalog.>) pg_catalog.now() GROUP BY k.owner, k.scope";
  if (!pg::spi::connect())
    throw Error(ERRCODE_INTERNAL_ERROR, "SPI_connect failed in stuck_holders_rows()");
  pg::spi::rows_into_result(sql.c_str(), rsinfo, "stuck_holders_rows()");
  pg::spi::finish();
  return static_cast<Datum>(0);
}

}  // namespace
}  // namespace idem::sql_functions

IDEM_SQL_FUNCTION(claim_key, idem::sql_functions::sql_claim_key)
IDEM_SQL_FUNCTION(complete_key, idem::sql_functions::sql_complete_key)
IDEM_SQL_FUNCTION(release_key, idem::sql_functions::sql_release_key)
IDEM_SQL_FUNCTION(checkpoint_key, idem::sql_functions::sql_checkpoint_key)
IDEM_SQL_FUNCTION(look_key, idem::sql_functions::sql_look_key)
IDEM_SQL_FUNCTION(forget_key, idem::sql_functions::sql_forget_key)
IDEM_SQL_FUNCTION(key_policy, idem::sql_functions::sql_key_policy)
IDEM_SQL_FUNCTION(stuck_holders_rows, idem::sql_functions::sql_stuck_holders_rows)
