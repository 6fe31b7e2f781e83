// The installation check (installation_check.hpp), which reads the catalogs with PostgreSQL
// calls only (installation_check*.cpp, beside this file), as C++ runs it. Every wrapper
// catches (pg_call).
#pragma once

#include "../installation_check.hpp"
#include "../pg_boundary.hpp"

namespace idem::pg::installation {

// installation_check::examine(schema, found, refusal) under pg_call. Raises (a syscache or
// catalog read failure). Allocates in the current memory context.
inline bool examine(Oid schema, installation_check::Found* found,
                    installation_check::Refusal* refusal) {
  return pg_call([&] { return installation_check::examine(schema, found, refusal); });
}
// The schema of extension idempotency in the current database, InvalidOid when it is not
// installed. Raises (a catalog read failure). Allocates nothing that outlives the call.
inline Oid extension_schema() {
  return pg_call([] {
    Oid extension = InvalidOid;
    Oid schema = InvalidOid;
    (void)installation_check::find_extension(&extension, &schema);
    return schema;
  });
}

}  // namespace idem::pg::installation
