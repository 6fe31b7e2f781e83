// The extension's event trigger (idempotency--1.1--1.2.sql, "security" section): at the end
// of every DDL command of a role that is not a superuser, refuse the command if it created or
// changed an object in the extension's schema.
//
// The run-time check (installation_check.hpp) refuses every call of the extension while a
// role that is not a superuser may create objects in its schema, or while an object there is
// not the extension's. But a look-alike that such a role plants there, say
// idempotency.complete_key(text, text, text), is not the extension's code: a call that
// resolves to it (untyped literals match it better) runs it, as whoever calls, and no check
// of ours ever runs. So the planting itself is refused, whoever granted the privilege that
// allowed it. Superusers are trusted (and Citus creates its shards there as one).
#include "pg/catalog.hpp"
#include "pg/spi.hpp"

namespace idem::schema_guard {
namespace {

Datum sql_guard_schema(FunctionCallInfo fcinfo) {
  if (!CALLED_AS_EVENT_TRIGGER(fcinfo))
    throw Error(ERRCODE_E_R_I_E_EVENT_TRIGGER_PROTOCOL_VIOLATED,
                "idempotency_guard_schema() may only be called by an event trigger");
  // The trigger function lives in the extension's schema.
  const Oid schema = pg::catalog::function_schema(fcinfo->flinfo->fn_oid);
  // Creating or changing an object in a schema takes CREATE on it (CREATE OR REPLACE,
  // ALTER ... SET SCHEMA and RENAME too); without it, this command touched nothing there.
  const bool may_create = !pg::catalog::current_user_is_superuser() &&
                          pg::catalog::has_schema_privilege(schema, GetUserId(), ACL_CREATE);
  if (!may_create) return PointerGetDatum(nullptr);
  // What the command made, as the event trigger manager collected it (each name qualified:
  // the statement resolves nothing through search_path).
  const char* schema_name = pg::catalog::schema_name(schema);
  if (!pg::spi::connect()) throw Error(ERRCODE_INTERNAL_ERROR, "SPI_connect failed");
  const char* touched = pg::spi::first_text(
      "SELECT object_type OPERATOR(pg_catalog.||) ' ' OPERATOR(pg_catalog.||) "
      "coalesce(object_identity, '?') FROM pg_catalog.pg_event_trigger_ddl_commands()"
      " WHERE schema_name OPERATOR(pg_catalog.=) $1",
      schema_name != nullptr ? schema_name : "", TopTransactionContext,
      "could not read the commands of the event trigger");
  pg::spi::finish();
  if (touched != nullptr)
    throw Error(ERRCODE_INSUFFICIENT_PRIVILEGE,
                std::string("only superusers may create or change objects in schema \"") +
                    (schema_name != nullptr ? schema_name : "?") + "\" of extension idempotency",
                std::string("The command made ") + touched + ".",
                "A look-alike of the extension's functions there would catch other roles' "
                "calls. REVOKE CREATE ON SCHEMA idempotency from the roles that hold it; see "
                "SECURITY.md.");
  return PointerGetDatum(nullptr);
}

}  // namespace
}  // namespace idem::schema_guard

IDEM_SQL_FUNCTION(idempotency_guard_schema, idem::schema_guard::sql_guard_schema)
