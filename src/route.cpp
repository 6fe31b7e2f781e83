// The route of a call to the key table (route.hpp).
#include "route.hpp"

#include "citus_guard.hpp"
#include "gucs.hpp"
#include "key_layout.hpp"

namespace idem::route {
namespace {

// Citus can only be loaded with the server (shared_preload_libraries), before any call
// here, so the answer holds for the backend's life: looked up once, not on every call.
bool without_citus() {
  static const bool answer = !citus_guard::citus_loaded();
  return answer;
}

}  // namespace

bool direct_path() {
  return without_citus() && ExecutorCheckPerms_hook == nullptr && object_access_hook == nullptr;
}

// Per call (the relcache entry is current once the table is locked).
ExecutorReason write_reason(Relation table) {
  if (gucs::executor_path) return ExecutorReason::kRequested;
  const ExecutorReason by_layout = key_layout::current().executor_reason;
  if (by_layout != ExecutorReason::kNone) return by_layout;
  if (table->rd_rel->relispartition) return ExecutorReason::kNotHeapTable;
  if (table->trigdesc != nullptr) return ExecutorReason::kTrigger;
  if (table->rd_rules != nullptr) return ExecutorReason::kRule;
  if (table->rd_rel->relrowsecurity) return ExecutorReason::kRowSecurity;
  const TupleConstr* constraints = table->rd_att->constr;
  if (constraints == nullptr) return ExecutorReason::kNone;
  if (constraints->num_check > 0) return ExecutorReason::kCheckConstraint;
  bool generated = constraints->has_generated_stored;
#if PG_VERSION_NUM >= 180000
  generated = generated || constraints->has_generated_virtual;
#endif
  return generated ? ExecutorReason::kIdentityGenerated : ExecutorReason::kNone;
}

Route Route::of_call() {
  Route route;
  route.direct_ = direct_path();
  route.requested_ = gucs::executor_path;
  route.snapshot_ = ActiveSnapshotSet();
  return route;
}

void Route::table_opened(Relation table) {
  reason_ = write_reason(table);
}

}  // namespace idem::route
