// What makes an installation of the extension safe to act as its owner in (SPEC §7), checked
// in full: caller.cpp keeps the result per backend and forgets it on every catalog change
// that could alter it.
//
// The owner is a superuser, so anything that runs while we act as the owner runs with a
// superuser's rights, and with the calling session's temporary schema within reach of every
// unqualified name. So:
//   - only superusers own the schema and every object in it, and no other role (PUBLIC
//     included, or through role membership) may create objects in the schema, as
//     has_schema_privilege sees it: the install script's own rule;
//   - the schema holds the extension's objects only (pg_depend: members of the extension;
//     their indexes, row types and array types; under Citus the shards of its tables);
//   - no other role holds a right on the extension's tables (or on a column of them);
//   - the tables carry no code: no trigger (but TRUNCATE-only ones, which no claim fires,
//     and internal ones that are not a foreign key's), rule, row-level security or policy,
//     CHECK constraint, foreign key, default but the constants of the install script,
//     generated or identity column, column of a type that is neither built in nor the
//     extension's (domains check and default, other types bring their functions), index
//     with expressions, a predicate or an operator class or access method that is not
//     built in, statistics object with expressions, or inheritance.
// Extra plain columns without defaults, extra plain indexes, typmods and NOT NULLs are
// allowed: they only send writes through the executor (key_heap.cpp).
#pragma once

#include "pg.hpp"

namespace idem::installation_check {

// A refusal: SQLSTATE, message and hint, palloc'd.
struct Refusal {
  int sqlstate = 0;
  const char* message = nullptr;
  const char* hint = nullptr;
};

// What a safe installation is made of.
struct Found {
  Oid table = InvalidOid;  // idempotency_keys
  Oid owner = InvalidOid;  // its owner, a superuser
};

// The extension idempotency of the current database and its schema, from pg_extension;
// false when it is not installed. PostgreSQL code only, like examine().
bool find_extension(Oid* extension, Oid* schema);

// Checks the installation whose schema is `schema`; false with `*refusal` filled in when it
// is not safe. PostgreSQL code only (no C++ object that a longjmp could skip): the caller
// runs it inside one pg_call. May raise PostgreSQL errors of its own (say a table dropped
// while it is read).
bool examine(Oid schema, Found* found, Refusal* refusal);

}  // namespace idem::installation_check
