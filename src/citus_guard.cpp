// A NULL key never reaches Citus' function delegation (see citus_guard.hpp).
#include "citus_guard.hpp"

#include "pg_boundary.hpp"

namespace idem::citus_guard {
namespace {

planner_hook_type next_planner = nullptr;

// The functions the Citus recipe delegates by their first argument, the key.
constexpr const char* kDelegated[] = {"claim_key",      "complete_key", "release_key",
                                      "checkpoint_key", "look_key",     "forget_key"};

bool is_null_argument(Node* argument, ParamListInfo params) {
  if (argument == nullptr) return false;
  if (IsA(argument, Const)) return castNode(Const, argument)->constisnull;
  if (IsA(argument, Param) && params != nullptr) {
    auto* param = castNode(Param, argument);
    if (param->paramkind != PARAM_EXTERN || param->paramid <= 0 ||
        param->paramid > params->numParams)
      return false;
    if (params->paramFetch != nullptr) {
      ParamExternData workspace;
      ParamExternData* data = params->paramFetch(params, param->paramid, false, &workspace);
      return data != nullptr && data->isnull;
    }
    return params->params[param->paramid - 1].isnull;
  }
  return false;
}

// pg-frame: under the planner hook, a PostgreSQL frame; owns no C++ object.
bool is_delegated_function(Oid function) {
  const char* schema = get_namespace_name(get_func_namespace(function));
  if (schema == nullptr || strcmp(schema, "idempotency") != 0) return false;
  const char* name = get_func_name(function);
  if (name == nullptr) return false;
  for (const char* delegated : kDelegated)
    if (strcmp(name, delegated) == 0) return true;
  return false;
}

struct WalkContext {
  ParamListInfo params;
};

// pg-frame: the planner hook's tree walker, a PostgreSQL frame; owns no C++ object.
bool find_null_key(Node* node, void* raw_context) {
  if (node == nullptr) return false;
  auto* context = static_cast<WalkContext*>(raw_context);
  if (IsA(node, FuncExpr)) {
    auto* call = castNode(FuncExpr, node);
    if (call->args != NIL &&
        is_null_argument(static_cast<Node*>(linitial(call->args)), context->params) &&
        is_delegated_function(call->funcid))
      ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
                      errmsg("idempotency key must not be null")));
  }
  // Subqueries are planned on their own: only this query level is Citus' to delegate.
  if (IsA(node, Query)) return false;
#if PG_VERSION_NUM >= 160000
  return expression_tree_walker(node, find_null_key, raw_context);
#else
  // PostgreSQL 15 declares the walker as an unprototyped C function pointer.
  auto* walker = reinterpret_cast<bool (*)()>(reinterpret_cast<void (*)()>(find_null_key));
  return expression_tree_walker(node, walker, raw_context);
#endif
}

void reject_null_keys(Query* parse, ParamListInfo params) {
  // Citus delegates `SELECT f(...)` and `SELECT ... FROM f(...)` with no other relation.
  if (parse->commandType == CMD_SELECT) {
    WalkContext context{params};
    (void)find_null_key(reinterpret_cast<Node*>(parse->targetList), &context);
    ListCell* cell = nullptr;
    foreach (cell, parse->rtable) {
      auto* entry = static_cast<RangeTblEntry*>(lfirst(cell));
      if (entry->rtekind == RTE_FUNCTION)
        (void)find_null_key(reinterpret_cast<Node*>(entry->functions), &context);
    }
  }
}

#if PG_VERSION_NUM >= 190000  // the planner hook gained the EXPLAIN state
PlannedStmt* guarded_planner(Query* parse, const char* query_string, int cursor_options,
                             ParamListInfo params, ExplainState* explain) {
  reject_null_keys(parse, params);
  return next_planner != nullptr
             ? next_planner(parse, query_string, cursor_options, params, explain)
             : standard_planner(parse, query_string, cursor_options, params, explain);
}
#else
PlannedStmt* guarded_planner(Query* parse, const char* query_string, int cursor_options,
                             ParamListInfo params) {
  reject_null_keys(parse, params);
  return next_planner != nullptr ? next_planner(parse, query_string, cursor_options, params)
                                 : standard_planner(parse, query_string, cursor_options, params);
}
#endif

}  // namespace

bool citus_loaded() {
  return GetConfigOption("citus.version", true, false) != nullptr &&
         (GetConfigOptionFlags("citus.version", true) & GUC_CUSTOM_PLACEHOLDER) == 0;
}

void install_if_citus() {
  // Loaded after citus (shared_preload_libraries = 'citus,idempotency'), so this hook runs
  // before Citus' planner; without Citus there is nothing to guard and nothing is hooked.
  if (!citus_loaded()) return;
  next_planner = planner_hook;
  planner_hook = guarded_planner;
}

}  // namespace idem::citus_guard
