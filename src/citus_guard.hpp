// Citus 13 crashes the backend when it delegates a distributed function call whose
// distribution argument is NULL (a Citus bug: the call never reaches our function). Under the
// recipe of SPEC §6 the key is that argument of claim_key / complete_key / release_key /
// checkpoint_key. This planner hook, installed only when Citus is loaded before us, refuses
// such a call with the function's own error (22004) before Citus' planner sees it.
#pragma once

namespace idem::citus_guard {

// Called from _PG_init.
void install_if_citus();

// Is the Citus library loaded in this process? Any role can SET citus.version, which only
// makes a placeholder of that name; Citus itself defines the variable when it loads.
bool citus_loaded();

}  // namespace idem::citus_guard
