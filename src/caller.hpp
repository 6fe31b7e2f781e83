// Who calls, and what the extension acts as (SPEC §7).
//
// The SQL functions run as their caller (SECURITY INVOKER): the caller is GetUserId(), the
// role whose rights are in force, and keys belong to it. The table itself belongs to the
// extension owner, a superuser, and is reached only while acting as that owner, the way
// core switches users for REFRESH MATERIALIZED VIEW and autovacuum: a local user id change
// under SECURITY_RESTRICTED_OPERATION, with search_path pinned to pg_catalog, undone on
// every exit. The cleanup worker uses the same switch.
//
// Before every switch the installation is checked by OID: the extension's schema and its
// idempotency_keys table must be owned by superusers. Only a superuser can then create,
// rename or replace anything a statement of ours names, so no kept plan, re-parsed after an
// invalidation, can land on an object an untrusted role made.
#pragma once

#include "pg.hpp"

namespace idem::caller {

// The extension's table in the current database, checked.
struct Installation {
  Oid schema;
  Oid table;
  Oid owner;  // the table's owner: the extension owner, a superuser
};

// The installation the SQL function `function` belongs to (found through the function's
// schema: only a superuser can create a C function). Throws 42501 when the schema or the
// table is owned by a role that is not a superuser, 42P01 when the table is missing.
Installation of_function(Oid function);

// The installation in the current database, found through pg_extension (for the worker);
// nullopt when the extension is not installed. Checked like of_function().
std::optional<Installation> of_database();

// The role calling the SQL function `function_name`: GetUserId(). Throws 42501 inside a
// security-restricted operation (an index expression, ANALYZE, autovacuum, REFRESH
// MATERIALIZED VIEW), where the current user is not the one who asked for the call.
Oid calling_role(const char* function_name);

// The name of `role` as the key table stores it (the key's owner), cached per backend until
// pg_authid changes. The name, not the OID, is what identifies a key's role wherever its row
// moves (dump and restore, COPY, logical replication, Citus nodes with their own OIDs); the
// row's stamp (the OID and system_identifier() below) tells, in this cluster, the role that
// wrote it from a later role of the same name. An unknown role raises 42704.
text* name_of(Oid role);

// The cluster's system identifier (pg_control_system()), read once per backend: with the
// role's OID, the stamp that tells a row written by this role from one of an earlier role of
// the same name (key_row.hpp, belongs_to). Physical replicas share it; a cluster made by
// initdb (a restore's target, pg_upgrade's new cluster, a logical subscriber) has its own.
int64 system_identifier();

// Acts as the installation's owner for the lifetime of the object: user id switched under
// SECURITY_RESTRICTED_OPERATION, search_path = pg_catalog, pg_temp. The destructor restores
// both; an ERROR that unwinds past it through PostgreSQL's abort restores them too.
//
// Only a statement resolves names, so search_path may be pinned when the first statement
// is about to run (kBeforeFirstStatement: the user calls pin_search_path() then) instead
// of at once: the claim path's direct heap and index work parses nothing, and a replay
// then costs no GUC change.
class ActingAsOwner {
 public:
  enum class SearchPath { kNow, kBeforeFirstStatement };
  explicit ActingAsOwner(const Installation& installation, SearchPath when = SearchPath::kNow);
  // Sets search_path = pg_catalog, pg_temp at a new GUC nesting level (once).
  void pin_search_path();
  ~ActingAsOwner();
  ActingAsOwner(const ActingAsOwner&) = delete;
  ActingAsOwner& operator=(const ActingAsOwner&) = delete;
  ActingAsOwner(ActingAsOwner&&) = delete;
  ActingAsOwner& operator=(ActingAsOwner&&) = delete;

 private:
  void restore() noexcept;

  Oid saved_user_ = InvalidOid;
  int saved_context_ = 0;
  int guc_nest_level_ = 0;  // 0: search_path not pinned
  bool active_ = false;
};

}  // namespace idem::caller
