// The scan of claim_key / complete_key in FROM (result_scan.hpp).
//
// Every function here but direct_row() is called by PostgreSQL (the planner hook, the path and
// plan callbacks, the executor callbacks) and owns no C++ object: PostgreSQL's errors pass
// through them as through C code.
#include "result_scan.hpp"

#include "gucs.hpp"
#include "installation_check.hpp"

// The SQL-callable functions whose answer is a claim_result (sql_functions.cpp).
extern "C" {
Datum claim_key(PG_FUNCTION_ARGS);
Datum complete_key(PG_FUNCTION_ARGS);
}

namespace idem::result_scan {
namespace {

constexpr uint32 kDirectRowMagic = 0x69646d72;  // "idmr"
constexpr const char* kScanName = "idempotency function";

static_assert(std::is_trivially_destructible_v<DirectRow>, "DirectRow lives in palloc'd memory");

// The executor state of one scan.
struct ResultScanState {
  CustomScanState base;  // first: PostgreSQL sees a CustomScanState
  FmgrInfo function;
  FunctionCallInfo call;
  List* arguments;             // ExprState of each argument
  Bitmapset* argument_params;  // PARAM_EXEC ids the arguments read ...
  bool params_collected;       // ... collected at the first rescan (most scans have none)
  int columns;                 // the scan tuple's columns ...
  int* column_of;              // ... and the function's column (0-based) behind each
  MemoryContext later_calls;   // the answers of calls after the first (a LATERAL call)
  int calls;
  bool answered;  // row holds the answer for the current arguments
  bool returned;  // the row was returned since the last rescan
  DirectRow row;
};

set_rel_pathlist_hook_type previous_pathlist_hook = nullptr;

Plan* plan_scan(PlannerInfo* root, RelOptInfo* rel, CustomPath* path, List* tlist, List* clauses,
                List* custom_plans);
Node* create_scan_state(CustomScan* plan);
void begin_scan(CustomScanState* node, EState* estate, int eflags);
TupleTableSlot* exec_scan(CustomScanState* node);
void end_scan(CustomScanState* node);
void rescan(CustomScanState* node);

const CustomPathMethods kPathMethods = {kScanName, plan_scan, nullptr};
const CustomScanMethods kPlanMethods = {kScanName, create_scan_state};
// No mark / restore, no parallel scan, nothing of our own in EXPLAIN.
const CustomExecMethods kExecMethods = {kScanName, begin_scan, exec_scan, end_scan, rescan,
                                        nullptr,   nullptr,    nullptr,   nullptr,  nullptr,
                                        nullptr,   nullptr,    nullptr};

// claim_key and complete_key in the schema of the extension of this database (none when it is
// not installed), found again after any change to pg_proc: creating, dropping or moving the
// extension changes its functions' rows. Every query with a function in FROM compares with
// their OIDs, so an unrelated function costs no catalog look-up. Each keeps its call
// information from its first use on: fmgr_info reads pg_proc and the library's function table
// at every call (about 500 instructions), which neither the planner nor a scan repeats.
struct OurFunction {
  Oid oid = InvalidOid;
  bool has_info = false;
  FmgrInfo info{};  // in TopMemoryContext, once has_info
};
struct OurFunctions {
  bool valid = false;
  std::array<OurFunction, 8> functions;
  int count = 0;
};
OurFunctions our_functions;
uint64 pg_proc_changes = 0;  // counts the invalidations below

void forget_our_functions(Datum, SyscacheId, uint32) {
  our_functions.valid = false;
  ++pg_proc_changes;
}

// pg-frame: planner. Fills `found` from pg_extension and pg_proc (by name, in the schema).
void find_our_functions(OurFunctions* found) {
  *found = OurFunctions{};
  Oid extension = InvalidOid;
  Oid schema = InvalidOid;
  if (!installation_check::find_extension(&extension, &schema)) return;
  for (const char* name : {"claim_key", "complete_key"}) {
    CatCList* candidates = SearchSysCacheList1(PROCNAMEARGSNSP, CStringGetDatum(name));
    for (int i = 0; i < candidates->n_members; ++i) {
      const auto* proc = reinterpret_cast<Form_pg_proc>(GETSTRUCT(&candidates->members[i]->tuple));
      if (proc->pronamespace == schema && found->count < static_cast<int>(found->functions.size()))
        found->functions[found->count++].oid = proc->oid;
    }
    ReleaseSysCacheList(candidates);
  }
}

// pg-frame: planner and BeginCustomScan. Our entry of `function`, nullptr for any other
// function. The look-up reads catalogs: an invalidation it processes makes it look again.
OurFunction* our_function(Oid function) {
  while (!our_functions.valid) {
    const uint64 seen = pg_proc_changes;
    OurFunctions found;
    find_our_functions(&found);
    found.valid = seen == pg_proc_changes;
    our_functions = found;
  }
  for (int i = 0; i < our_functions.count; ++i)
    if (our_functions.functions[i].oid == function) return &our_functions.functions[i];
  return nullptr;
}

// pg-frame: planner and BeginCustomScan. The call information of `function`, one of ours:
// kept in its entry from the first use on, unless an invalidation came while it was looked up
// (then `scratch` holds it, made in the current memory context).
FmgrInfo* function_info(OurFunction& entry, FmgrInfo* scratch) {
  if (entry.has_info) return &entry.info;
  const uint64 seen = pg_proc_changes;
  const Oid function = entry.oid;
  fmgr_info(function, scratch);
  if (seen != pg_proc_changes) return scratch;
  fmgr_info_copy(&entry.info, scratch, TopMemoryContext);
  entry.has_info = true;
  return &entry.info;
}

// pg-frame: planner. Whether `function` is one of our claim_result functions, called
// directly: a SECURITY DEFINER, SET or fmgr-hooked function gets a wrapper address. Only
// our own functions reach fmgr_info (which reads catalogs and may load a library).
bool is_ours(Oid function) {
  OurFunction* entry = our_function(function);
  if (entry == nullptr) return false;
  FmgrInfo scratch;
  const FmgrInfo* info = function_info(*entry, &scratch);
  return info->fn_addr == claim_key || info->fn_addr == complete_key;
}

// pg-frame: planner and executor (an expression walker). Adds the PARAM_EXEC ids that `node`
// reads to `*ids`: the ids a rescan's chgParam names. pull_paramids() promises all Params,
// whose ids of other kinds ($n, PL/pgSQL variables) would collide with them.
bool collect_exec_params(Node* node, void* ids) {
  if (node == nullptr) return false;
  if (IsA(node, Param)) {
    const auto* param = castNode(Param, node);
    if (param->paramkind == PARAM_EXEC)
      *static_cast<Bitmapset**>(ids) =
          bms_add_member(*static_cast<Bitmapset**>(ids), param->paramid);
    return false;
  }
#if PG_VERSION_NUM >= 160000
  return expression_tree_walker(node, collect_exec_params, ids);
#else
  // PostgreSQL 15 declares the walker as an unprototyped C function pointer.
  auto* walker = reinterpret_cast<bool (*)()>(reinterpret_cast<void (*)()>(collect_exec_params));
  return expression_tree_walker(node, walker, ids);
#endif
}

// pg-frame: planner. The call of the FROM item `rte` if our scan can run it, else nullptr.
FuncExpr* our_call(PlannerInfo* root, RelOptInfo* rel, Index rti, RangeTblEntry* rte) {
  if (rte->rtekind != RTE_FUNCTION || rel->reloptkind != RELOPT_BASEREL) return nullptr;
  if (list_length(rte->functions) != 1 || rte->funcordinality) return nullptr;
  Node* expression = linitial_node(RangeTblFunction, rte->functions)->funcexpr;
  if (!IsA(expression, FuncExpr)) return nullptr;
  auto* call = castNode(FuncExpr, expression);
  if (call->funcretset || !is_ours(call->funcid)) return nullptr;
  // A correlated sub-select in the arguments is a SubPlan, run by the function scan's
  // expression state; an uncorrelated one is an initPlan whose value our scan reads as a
  // parameter.
  if (contain_subplans(reinterpret_cast<Node*>(call->args))) return nullptr;
  // FOR UPDATE or UPDATE ... FROM copies the whole row for a recheck: the function scan's job.
  ListCell* cell = nullptr;
  foreach (cell, root->rowMarks) {
    if (lfirst_node(PlanRowMark, cell)->rti == rti) return nullptr;
  }
  return call;
}

// pg-frame: planner. The columns of `rel` that the query reads (its output, its quals, the
// clauses of its parameterized paths) as an integer list of attribute numbers; NIL with
// *whole_row set when it reads the row as a whole (our scan returns columns only).
List* needed_columns(RelOptInfo* rel, bool* whole_row) {
  Bitmapset* attributes = nullptr;
  pull_varattnos(reinterpret_cast<Node*>(rel->reltarget->exprs), rel->relid, &attributes);
  // The clauses are RestrictInfos, which the expression walker does not enter.
  auto add_clauses = [&](List* clauses) {
    ListCell* cell = nullptr;
    foreach (cell, clauses) {
      pull_varattnos(reinterpret_cast<Node*>(lfirst_node(RestrictInfo, cell)->clause), rel->relid,
                     &attributes);
    }
  };
  add_clauses(rel->baserestrictinfo);
  ListCell* cell = nullptr;
  foreach (cell, rel->pathlist) {
    auto* path = static_cast<Path*>(lfirst(cell));
    if (path->param_info != nullptr) add_clauses(path->param_info->ppi_clauses);
  }
  *whole_row = false;
  List* columns = NIL;
  int member = -1;
  while ((member = bms_next_member(attributes, member)) >= 0) {
    const AttrNumber attribute = member + FirstLowInvalidHeapAttributeNumber;
    if (attribute <= 0) {
      *whole_row = true;
      return NIL;
    }
    columns = lappend_int(columns, attribute);
  }
  return columns;
}

// pg-frame: planner. Our path in place of the function scan `scan`, at the same cost.
CustomPath* our_path(Path* scan, List* columns) {
  CustomPath* path = makeNode(CustomPath);
  path->path.pathtype = T_CustomScan;
  path->path.parent = scan->parent;
  path->path.pathtarget = scan->pathtarget;
  path->path.param_info = scan->param_info;
  path->path.parallel_safe = scan->parallel_safe;
  path->path.rows = scan->rows;
#if PG_VERSION_NUM >= 180000
  path->path.disabled_nodes = scan->disabled_nodes;
#endif
  path->path.startup_cost = scan->startup_cost;
  path->path.total_cost = scan->total_cost;
  path->path.pathkeys = scan->pathkeys;
  path->flags = CUSTOMPATH_SUPPORT_PROJECTION;
  path->custom_private = columns;
  path->methods = &kPathMethods;
  return path;
}

// pg-frame: the planner's set_rel_pathlist hook.
void plan_result_scans(PlannerInfo* root, RelOptInfo* rel, Index rti, RangeTblEntry* rte) {
  if (previous_pathlist_hook != nullptr) previous_pathlist_hook(root, rel, rti, rte);
  if (!gucs::result_scan || our_call(root, rel, rti, rte) == nullptr) return;
  bool whole_row = false;
  List* columns = needed_columns(rel, &whole_row);
  if (whole_row) return;
  ListCell* cell = nullptr;
  foreach (cell, rel->pathlist) {
    auto* path = static_cast<Path*>(lfirst(cell));
    if (path->pathtype == T_FunctionScan) lfirst(cell) = our_path(path, columns);
  }
}

// pg-frame: the path's PlanCustomPath. The scan tuple holds the needed columns in attribute
// order (custom_scan_tlist); custom_exprs holds the call, so that the plan depends on the
// function and create_customscan_plan turns outer references into nestloop parameters.
Plan* plan_scan(PlannerInfo* root, RelOptInfo* rel, CustomPath* path, List* tlist, List* clauses,
                List* /*custom_plans*/) {
  RangeTblEntry* rte = root->simple_rte_array[rel->relid];
  auto* call = castNode(FuncExpr, linitial_node(RangeTblFunction, rte->functions)->funcexpr);
  TupleDesc row_type = lookup_rowtype_tupdesc(call->funcresulttype, -1);
  List* scan_tlist = NIL;
  ListCell* cell = nullptr;
  foreach (cell, path->custom_private) {
    const AttrNumber attribute = static_cast<AttrNumber>(lfirst_int(cell));
    Form_pg_attribute column = TupleDescAttr(row_type, attribute - 1);
    Var* var = makeVar(rel->relid, attribute, column->atttypid, column->atttypmod,
                       column->attcollation, 0);
    scan_tlist = lappend(scan_tlist, makeTargetEntry(reinterpret_cast<Expr*>(var),
                                                     list_length(scan_tlist) + 1, nullptr, false));
  }
  ReleaseTupleDesc(row_type);

  CustomScan* scan = makeNode(CustomScan);
  scan->scan.plan.targetlist = tlist;
  scan->scan.plan.qual = extract_actual_clauses(clauses, false);
  scan->scan.scanrelid = 0;  // no relation to open: the scan tuple is custom_scan_tlist
  scan->flags = path->flags;
  scan->custom_exprs = list_make1(copyObjectImpl(call));
  scan->custom_private = list_copy(path->custom_private);
  scan->custom_scan_tlist = scan_tlist;
  scan->methods = &kPlanMethods;
  return &scan->scan.plan;
}

// pg-frame: the plan's CreateCustomScanState.
Node* create_scan_state(CustomScan* /*plan*/) {
  auto* state = static_cast<ResultScanState*>(palloc0(sizeof(ResultScanState)));
  NodeSetTag(state, T_CustomScanState);
  state->base.methods = &kExecMethods;
  return reinterpret_cast<Node*>(state);
}

// pg-frame: executor. What ExecInitFunc checks before a function runs.
void check_execute(Oid function) {
  const AclResult result = object_acl(ProcedureRelationId, function, GetUserId(), ACL_EXECUTE);
  if (result != ACLCHECK_OK) aclcheck_error(result, OBJECT_FUNCTION, get_func_name(function));
  InvokeFunctionExecuteHook(function);
}

// pg-frame: BeginCustomScan. The call is set up once per execution of the plan.
void begin_scan(CustomScanState* node, EState* estate, int /*eflags*/) {
  auto* state = reinterpret_cast<ResultScanState*>(node);
  auto* plan = reinterpret_cast<CustomScan*>(node->ss.ps.plan);
  auto* call = linitial_node(FuncExpr, plan->custom_exprs);
  check_execute(call->funcid);
  // The plan was made for one of our functions; should the list have changed since, the call
  // information is looked up as the executor would.
  if (OurFunction* entry = our_function(call->funcid); entry != nullptr) {
    FmgrInfo scratch;
    fmgr_info_copy(&state->function, function_info(*entry, &scratch), estate->es_query_cxt);
  } else {
    fmgr_info_cxt(call->funcid, &state->function, estate->es_query_cxt);
  }
  fmgr_info_set_expr(reinterpret_cast<Node*>(call), &state->function);
  const int arguments = list_length(call->args);
  state->call = static_cast<FunctionCallInfo>(palloc0(SizeForFunctionCallInfo(arguments)));
  InitFunctionCallInfoData(*state->call, &state->function, arguments, call->inputcollid, nullptr,
                           reinterpret_cast<Node*>(&state->row));
  state->arguments = ExecInitExprList(call->args, &node->ss.ps);
  state->argument_params = nullptr;
  state->params_collected = false;
  state->columns = list_length(plan->custom_private);
  state->column_of = static_cast<int*>(palloc(sizeof(int) * Max(state->columns, 1)));
  ListCell* cell = nullptr;
  int i = 0;
  foreach (cell, plan->custom_private) state->column_of[i++] = lfirst_int(cell) - 1;
  state->row.type = T_Invalid;
  state->row.magic = kDirectRowMagic;
  // The function fills its row only when it has the columns the function knows (as_datum).
  // (The type cache's descriptor, read without pinning it: nothing runs in between.)
  const TypeCacheEntry* row_type = lookup_type_cache(call->funcresulttype, TYPECACHE_TUPDESC);
  if (row_type->tupDesc == nullptr)
    elog(ERROR, "%s does not return a row type", get_func_name(call->funcid));
  state->row.columns = row_type->tupDesc->natts;
  for (i = 0; i < state->columns; ++i) {
    if (state->column_of[i] >= claim_result::kResultFields)
      elog(ERROR, "%s returns more columns than a claim_result", get_func_name(call->funcid));
  }
}

// pg-frame: executor. Calls the function with the current arguments; the answer stays in
// state->row until the arguments change. The first call's answer lives in the query's memory
// (as the function scan's tuplestore does); later calls reuse one context.
void call_function(ResultScanState* state) {
  EState* estate = state->base.ss.ps.state;
  MemoryContext memory = estate->es_query_cxt;
  if (state->calls++ > 0) {
    if (state->later_calls == nullptr)
      state->later_calls = AllocSetContextCreate(estate->es_query_cxt, "idempotency result scan",
                                                 ALLOCSET_SMALL_SIZES);
    else
      MemoryContextReset(state->later_calls);
    memory = state->later_calls;
  }
  const MemoryContext caller = MemoryContextSwitchTo(memory);
  FunctionCallInfo call = state->call;
  ExprContext* context = state->base.ss.ps.ps_ExprContext;
  bool null_argument = false;
  int i = 0;
  ListCell* cell = nullptr;
  foreach (cell, state->arguments) {
    call->args[i].value =
        ExecEvalExpr(static_cast<ExprState*>(lfirst(cell)), context, &call->args[i].isnull);
    null_argument = null_argument || call->args[i].isnull;
    ++i;
  }
  DirectRow& row = state->row;
  row.filled = false;
  if (!(state->function.fn_strict && null_argument)) {
    PgStat_FunctionCallUsage usage;
    pgstat_init_function_usage(call, &usage);
    call->isnull = false;
    (void)FunctionCallInvoke(call);
    pgstat_end_function_usage(&usage, true);
    if (!row.filled && !call->isnull)
      elog(ERROR, "%s returned no row to the idempotency result scan",
           get_func_name(state->function.fn_oid));
  }
  // A strict function given a NULL returns NULL: the function scan's row of NULLs.
  if (!row.filled) {
    for (i = 0; i < claim_result::kResultFields; ++i) row.nulls[i] = true;
  }
  MemoryContextSwitchTo(caller);
}

// pg-frame: executor (ExecScan's access method). One row per set of arguments.
TupleTableSlot* next_row(ScanState* scan) {
  auto* state = reinterpret_cast<ResultScanState*>(scan);
  TupleTableSlot* slot = scan->ss_ScanTupleSlot;
  ExecClearTuple(slot);
  if (state->returned) return slot;
  if (!state->answered) {
    call_function(state);
    state->answered = true;
  }
  state->returned = true;
  for (int i = 0; i < state->columns; ++i) {
    slot->tts_values[i] = state->row.values[state->column_of[i]];
    slot->tts_isnull[i] = state->row.nulls[state->column_of[i]];
  }
  return ExecStoreVirtualTuple(slot);
}

// pg-frame: executor (ExecScan's recheck method). Our scan is never a relation that an
// EvalPlanQual recheck substitutes a row for: a row-marked FROM item keeps the function scan
// (our_call). It runs under a recheck only inside a sub-select that the recheck runs again,
// where the function scan (a scan of a relation without a substitute row) runs its access
// method: the row of the current arguments, the function called only when they changed.
// Minor releases without core's test of the EPQ parameter (ExecScanFetch) ask the recheck
// method of every scan without a relation for that row, and then return the scan slot:
// so this answers what next_row() answers, in that slot.
bool recheck_row(ScanState* scan, TupleTableSlot* /*slot*/) {
  return !TupIsNull(next_row(scan));
}

// pg-frame: ExecCustomScan.
TupleTableSlot* exec_scan(CustomScanState* node) {
  return ExecScan(&node->ss, reinterpret_cast<ExecScanAccessMtd>(next_row),
                  reinterpret_cast<ExecScanRecheckMtd>(recheck_row));
}

// pg-frame: EndCustomScan. The memory is the query's; PostgreSQL frees the rest.
void end_scan(CustomScanState* /*node*/) {}

// pg-frame: ReScanCustomScan. As the function scan: the same row again, unless a parameter
// of the arguments changed (a LATERAL call for the next outer row).
void rescan(CustomScanState* node) {
  auto* state = reinterpret_cast<ResultScanState*>(node);
  state->returned = false;
  if (!state->params_collected) {
    MemoryContext caller = MemoryContextSwitchTo(node->ss.ps.state->es_query_cxt);
    auto* plan = reinterpret_cast<CustomScan*>(node->ss.ps.plan);
    (void)collect_exec_params(
        reinterpret_cast<Node*>(linitial_node(FuncExpr, plan->custom_exprs)->args),
        &state->argument_params);
    MemoryContextSwitchTo(caller);
    state->params_collected = true;
  }
  if (bms_overlap(node->ss.ps.chgParam, state->argument_params)) state->answered = false;
  ExecScanReScan(&node->ss);
}

}  // namespace

DirectRow* direct_row(FunctionCallInfo fcinfo) {
  auto* row = reinterpret_cast<DirectRow*>(fcinfo->resultinfo);
  return row != nullptr && row->type == T_Invalid && row->magic == kDirectRowMagic ? row : nullptr;
}

void on_load() {
  RegisterCustomScanMethods(&kPlanMethods);
  CacheRegisterSyscacheCallback(PROCOID, forget_our_functions, 0);
  previous_pathlist_hook = set_rel_pathlist_hook;
  set_rel_pathlist_hook = plan_result_scans;
}

}  // namespace idem::result_scan
