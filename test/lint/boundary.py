#!/usr/bin/env python3
"""The boundary rule of src/pg_boundary.hpp, checked where a text check can.

Rule: no PostgreSQL call that may raise (ereport longjmps) runs where a C++ object with a
destructor may be alive, and no C++ exception crosses a PostgreSQL frame. In the code that
means each call of a raising PostgreSQL function is
  - inside the callable of a pg_call(...) (which catches the error, and C++ exceptions too), or
  - in a function whose header comment says "pg-frame:" with a reason (the function runs only
    inside pg_call, or is itself called by PostgreSQL and owns no C++ object), or
  - on a line that ends with a "// pg: <reason>" comment (a deliberate, explained exception);
    for a call wrapped over several lines, any of its lines may carry it.

Conversely, neither a pg_call callable nor a pg-frame function may name a C++ type with a
destructor (std::string and the like, or a class of src/ that declares one): a longjmp would
skip it. Member functions defined in a class body are checked like any other function.

The layer rule (issue #39): every PostgreSQL call that C++ makes sits behind a named wrapper
in src/pg/ (each catching through pg_call, each with its one-line contract). In every file
outside src/pg/ that is not listed in NOT_YET_IN_LAYER, the lint refuses
  - any use of pg_call (call a wrapper of src/pg/ instead), and
  - any call of a raising function, whether in pg_call, in a pg-frame function or on a line
    marked "// pg:", except in the functions listed in PG_FRAMES: functions that PostgreSQL
    itself calls (hooks, callbacks) and the helpers they call, where no wrapper can stand
    between (a wrapper throws a C++ exception, which must not cross those frames).
Files in src/pg/ keep the older rule: the wrappers, and the PostgreSQL-only code that runs
inside one wrapper's pg_call (the installation check, pg/installation_check*.cpp).
NOT_YET_IN_LAYER names the files whose calls have not moved yet; they keep the older rule
above. It only shrinks.

The list of raising functions below is not complete; it names the ones this code uses, so a new
use of any of them is caught. Prints one line per violation (file:line: what) and exits 1 if
there is any. Usage: test/lint/boundary.py [FILE...] (default: src/*.cpp src/*.hpp and src/pg/).
"""
import glob
import re
import sys

# PostgreSQL functions and macros this code calls that may ereport(ERROR).
RAISING = r"""
palloc palloc0 repalloc pstrdup psprintf pfree cstring_to_text text_to_cstring
AllocSetContextCreate AllocSetContextCreateInternal MemoryContextReset MemoryContextDelete
SPI_connect SPI_finish SPI_execute SPI_execute_plan SPI_execute_with_args SPI_prepare
SPI_prepare_cursor SPI_keepplan SPI_freeplan SPI_freetuptable SPI_getbinval
table_open table_close relation_open relation_close index_open index_close
table_beginscan table_beginscan_catalog table_endscan heap_getnext systable_beginscan
systable_getnext systable_endscan index_beginscan index_rescan index_getnext_slot index_endscan
index_insert heap_insert heap_form_tuple heap_deform_tuple heap_fetch simple_heap_update
heap_abort_speculative heap_finish_speculative heap_freetuple table_slot_create
ExecDropSingleTupleTableSlot ExecFetchSlotHeapTuple slot_getallattrs
SearchSysCache1 SearchSysCacheExists1 GetSysCacheOid2 SysCacheGetAttr ReleaseSysCache
get_rel_name get_rel_namespace get_namespace_name get_func_namespace get_func_name
get_func_rettype get_fn_expr_rettype get_relname_relid get_typtype get_typlenbyvalalign
GetUserNameFromId lookup_rowtype_tupdesc ReleaseTupleDesc BuildIndexInfo RelationGetIndexList
ereport elog ReThrowError ThrowErrorData CopyErrorData CHECK_FOR_INTERRUPTS ProcessInterrupts
DirectFunctionCall1 DirectFunctionCall2 DirectFunctionCall3
PG_GETARG_TEXT_PP PG_GETARG_ARRAYTYPE_P PG_GETARG_JSONB_P PG_DETOAST_DATUM_PACKED
PG_DETOAST_DATUM_COPY DatumGetTextPP DatumGetByteaPP DatumGetJsonbP pg_detoast_datum_packed
toast_raw_datum_size deconstruct_array array_create_iterator array_iterate
hash_create hash_search InitMaterializedSRF tuplestore_putvalues
LockAcquire LockRelease ConditionVariableTimedSleep WaitLatch
SetCurrentStatementStartTimestamp StartTransactionCommand CommitTransactionCommand
AbortCurrentTransaction PushActiveSnapshot PopActiveSnapshot GetTransactionSnapshot
set_config_option SetConfigOption NewGUCNestLevel PreventCommandIfReadOnly
PreventCommandIfParallelMode CheckCmdReplicaIdentity pg_class_aclmask
CommandCounterIncrement GetCurrentTransactionId SpeculativeInsertionLockAcquire
numeric_normalize JsonbIteratorInit JsonbIteratorNext compareJsonbContainers
quote_qualified_identifier pg_cryptohash_create RegisterDynamicBackgroundWorker
BackgroundWorkerInitializeConnection BackgroundWorkerInitializeConnectionByOid
DefineCustomIntVariable DefineCustomBoolVariable DefineCustomStringVariable MarkGUCPrefixReserved
fmgr_info
standard_ProcessUtility
""".split()
CALL = re.compile(r"\b(" + "|".join(map(re.escape, RAISING)) + r")\s*\(")

# The layer of named wrappers, and the boundary mechanism it is built on.
LAYER = "src/pg/"
BOUNDARY = {"src/pg.hpp", "src/pg_boundary.hpp", "src/pg_boundary.cpp"}
# Files whose PostgreSQL calls have not moved behind src/pg/ yet (the older rule holds there).
NOT_YET_IN_LAYER = set()  # every file of src/ has moved
# (file, function): called by PostgreSQL itself, calling it directly where no wrapper can
# stand between. Each is marked "pg-frame:" in its file, with the reason.
PG_FRAMES = {
    ("src/key_wait.cpp", "initialize"),  # the shared-memory start-up hook, in the postmaster
    ("src/own_claims.cpp", "forget_rolled_back_claims"),  # a subtransaction callback
    ("src/gucs.cpp", "define"),  # under _PG_init: the settings' definitions
    ("src/gucs.cpp", "define_cleanup"),  # under _PG_init, through define()
    ("src/citus_guard.cpp", "is_delegated_function"),  # under the planner hook
    ("src/citus_guard.cpp", "find_null_key"),  # the planner hook's expression walker
    ("src/result_scan.cpp", "plan_scan"),  # the custom path's PlanCustomPath
    ("src/result_scan.cpp", "create_scan_state"),  # the plan's CreateCustomScanState
    ("src/result_scan.cpp", "check_execute"),  # under BeginCustomScan
    ("src/result_scan.cpp", "begin_scan"),  # BeginCustomScan
    ("src/result_scan.cpp", "function_info"),  # under BeginCustomScan
    ("src/result_scan.cpp", "call_function"),  # under ExecCustomScan
    ("src/worker_session.cpp", "prepare_settings"),  # a worker's main, before its C++ objects
    ("src/worker_session.cpp", "undo_database_settings"),  # a worker's main, likewise
    ("src/cleanup_worker.cpp", "database_main"),  # the database worker's main
    ("src/cleanup_call.cpp", "call_main"),  # idempotency_cleanup()'s worker's main, before its C++ objects
    ("src/cleanup_launcher.cpp", "launcher_main"),  # the launcher's main (it has no C++ object)
    ("src/cleanup_launcher.cpp", "plan_round"),  # under the launcher's main
    ("src/cleanup_launcher.cpp", "reap"),  # likewise
    ("src/cleanup_launcher.cpp", "start_pending"),  # likewise
    ("src/cleanup_launcher.cpp", "start_failed"),  # likewise
    ("src/cleanup_launcher.cpp", "grown"),  # likewise
    ("src/cleanup_shared.cpp", "check_roles"),  # under the launcher's plan_round
    ("src/cleanup_shared.cpp", "utility_hook"),  # the ProcessUtility hook
    # The key table's layout (key_layout.cpp): its cache is forgotten by PostgreSQL's callbacks,
    # and read in one step that runs whole under pg::storage::read_layout (a relcache
    # invalidation arriving meanwhile restarts the whole step, so it is one pg_call, not one
    # per catalog read).
    ("src/key_layout.cpp", "release_at_transaction_end"),  # a transaction callback
    ("src/key_layout.cpp", "forget_layout"),  # a relcache invalidation callback
    ("src/key_layout.cpp", "forget_labels"),  # a syscache invalidation callback
    ("src/key_layout.cpp", "release_insert_states"),  # under those callbacks, and the read
    ("src/key_layout.cpp", "read_into_cache"),  # the read, under pg::storage::read_layout
    ("src/key_layout.cpp", "read_layout"),  # under read_into_cache
    ("src/key_layout.cpp", "read_columns"),  # under read_layout
    ("src/key_layout.cpp", "read_indexes"),  # under read_layout
    ("src/key_layout.cpp", "is_expiry_bucket_index"),  # under read_indexes
    ("src/key_layout.cpp", "is_expiry_bucket_key"),  # under read_indexes, and the cleanup's
    ("src/key_layout.cpp", "insert_states_context"),  # under a BRIN insert (key_heap_write)
    # The direct path's reads and writes (key_heap*.cpp): each step runs whole under one
    # wrapper of src/pg/storage.hpp (one pg_call a step, as before the layer: the claim path's
    # instruction count stays; the speculative insertion's lock and super-delete stay in one
    # frame), and insert_brin_entry keeps its own PG_TRY to switch the resource owner back.
    ("src/key_heap.cpp", "probe"),  # under read_step and insert_step
    ("src/key_heap.cpp", "snapshot_of"),  # under the steps
    ("src/key_heap.cpp", "serialization_conflict"),  # under read_step and insert_step
    ("src/key_heap.cpp", "read_step"),  # under pg::storage::read_key
    ("src/key_heap_write.cpp", "insert_step"),  # under pg::storage::insert_claim
    ("src/key_heap_write.cpp", "update_step"),  # under pg::storage::update_claimed_row
    ("src/key_heap_write.cpp", "insert_index_entries"),  # under insert_step, add_index_entries
    ("src/key_heap_write.cpp", "insert_brin_entry"),  # under insert_index_entries (PG_TRY)
    ("src/key_heap_write.cpp", "probe_dirty"),  # under insert_step
    ("src/key_heap_write.cpp", "same_text"),  # under update_step, through holds
    ("src/key_heap_write.cpp", "holds"),  # under update_step
    ("src/result_scan.cpp", "is_ours"),  # under the planner hook (fmgr_info, now in RAISING)
}

# C++ types whose objects have destructors, as a pg_call callable or a pg-frame function would
# name them; the classes of src/ that declare a destructor are added by main().
OWNING_STD = (r"std::(?:string|vector|optional|unique_ptr|shared_ptr|function|map|unordered_map"
              r"|set|to_string)\b")
owning = re.compile(OWNING_STD)


def owning_types(files):
    """OWNING_STD and every class of `files` that declares a destructor (PgError aside: the
    boundary's own)."""
    names = set()
    for path in files:
        names.update(re.findall(r"~(\w+)\s*\(", strip(open(path, encoding="utf-8").read())))
    names.discard("PgError")
    return re.compile("|".join([OWNING_STD] + [r"\b%s\b" % n for n in sorted(names)]))


def strip(text):
    """Comments and string/char literals blanked out (lengths and newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + " " * (j - i - 2) + c if j - i >= 2 else text[i:j])
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def matching(code, open_at, opener="(", closer=")"):
    depth = 0
    for k in range(open_at, len(code)):
        if code[k] == opener:
            depth += 1
        elif code[k] == closer:
            depth -= 1
            if depth == 0:
                return k
    return len(code)


def check(path):
    text = open(path, encoding="utf-8").read()
    code = strip(text)
    lines = text.split("\n")
    line_of = lambda pos: code.count("\n", 0, pos) + 1
    # Spans wrapped by pg_call( ... ).
    wrapped = []
    for m in re.finditer(r"\bpg_call\s*\(", code):
        open_at = m.end() - 1
        wrapped.append((open_at, matching(code, open_at)))
    # Function bodies at namespace level, with the comment block above their signature.
    frames = []  # (start, end, exempt)
    depth_kinds = []
    pos = 0
    for m in re.finditer(r"[{}]", code):
        k = m.start()
        if code[k] == "{":
            head = code[pos:k]
            is_ns = re.search(r"\b(namespace|extern\s+\"\s*C\s*\")\s*[\w:]*\s*$", head) is not None
            is_type = re.search(r"\b(struct|class|union|enum)\b[^;()]*$", head) is not None
            # Member functions defined in a class body are functions too.
            if all(kind in ("ns", "type") for kind in depth_kinds) and not is_ns and not is_type:
                end = matching(code, k, "{", "}")
                sig_line = line_of(k)
                # the header comment: contiguous comment lines above the signature
                start_line = sig_line
                while start_line > 1 and not lines[start_line - 2].strip().startswith("//") and \
                        lines[start_line - 2].strip() not in ("", "}") and not lines[start_line - 2].rstrip().endswith(";"):
                    start_line -= 1
                comment = []
                j = start_line - 2
                while j >= 0 and lines[j].strip().startswith("//"):
                    comment.append(lines[j])
                    j -= 1
                exempt = any("pg-frame:" in c for c in comment)
                name = re.search(r"(~?\w+)\s*\([^{]*$", head)
                frames.append((k, end, exempt, name.group(1) if name else ""))
            depth_kinds.append("ns" if is_ns else ("type" if is_type else "block"))
        else:
            if depth_kinds:
                depth_kinds.pop()
        pos = k + 1
    problems = []
    annotated = lambda first, last: any(
        re.search(r"//\s*pg:\s*\S", lines[k - 1]) for k in range(first, last + 1))
    # A C++ object with a destructor where a longjmp may skip it: in a pg_call callable, or in
    # a function that says it is a PostgreSQL frame.
    for m in owning.finditer(code):
        at = m.start()
        where = None
        if any(a < at < b for a, b in wrapped):
            where = "a pg_call callable"
        elif any(a < at < b and exempt for a, b, exempt, _ in frames):
            where = "a function marked pg-frame"
        if where and not annotated(line_of(at), line_of(at)):
            problems.append(f"{path}:{line_of(at)}: {m.group(0)} (a C++ object with a destructor) in {where}")
    if in_layer_rule(path):
        for a, _ in wrapped:
            problems.append(f"{path}:{line_of(a)}: pg_call outside {LAYER}: call a wrapper of {LAYER}")
        for m in CALL.finditer(code):
            at = m.start()
            inside = [(exempt, name) for a, b, exempt, name in frames if a < at < b]
            if not inside:
                continue  # not in a function body (a declaration or a macro)
            if any(exempt and (path, name) in PG_FRAMES for exempt, name in inside):
                continue
            problems.append(f"{path}:{line_of(at)}: {m.group(1)}() outside {LAYER} (a raising "
                            f"PostgreSQL call: put it behind a wrapper of {LAYER})")
        return problems
    for m in CALL.finditer(code):
        at = m.start()
        if any(a < at < b for a, b in wrapped):
            continue
        if any(a < at < b and exempt for a, b, exempt, _ in frames):
            continue
        if not any(a < at < b for a, b, _, _ in frames):
            continue  # not in a function body (a declaration or a macro)
        line = line_of(at)
        # The reason may end any line of the call (clang-format wraps long calls).
        if annotated(line, line_of(matching(code, m.end() - 1))):
            continue
        problems.append(f"{path}:{line}: {m.group(1)}() outside pg_call, in a function not marked pg-frame")
    return problems


def in_layer_rule(path):
    """Outside src/pg/, in a file moved to the layer already."""
    path = path[2:] if path.startswith("./") else path
    return not path.startswith(LAYER) and path not in BOUNDARY and path not in NOT_YET_IN_LAYER


def main():
    sources = glob.glob("src/*.cpp") + glob.glob("src/*.hpp") + glob.glob(LAYER + "*.cpp") + \
        glob.glob(LAYER + "*.hpp")
    files = sys.argv[1:] or sorted(sources)
    global owning
    owning = owning_types(sorted(set(files) | set(glob.glob("src/*.hpp")) | set(glob.glob(LAYER + "*.hpp"))))
    problems = [p for f in files for p in check(f)]
    for p in problems:
        print(p)
    print(f"boundary: {len(problems)} violation(s) of the boundary rule in {len(files)} file(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
