#!/usr/bin/env bash
# What `make test` (and CI) runs: installs missing packages, builds and installs the
# extension, then runs every test suite, each discovered from files:
#
#   regress    sql/*.sql vs expected/*.out            pg_regress, temp instance
#   isolation  test/isolation/specs/*.spec            pg_isolation_regress, temp instance
#              (each spec on every path too, see "paths" below)
#   pgtap      test/pgtap/*.sql                       pg_prove, a fresh database per file
#              (files marked "-- On every path:" on every path too)
#   tap        test/t/*.pl                            prove + PostgreSQL::Test::Cluster
#   suites     test/suites/*.sh                       bash; last line "N passed, N failed"
#
# Usage: test/run.sh [SUITE[:NAME]]...   e.g.  test/run.sh regress pgtap:uuid_v7
# (NAME selects a test on every path; NAME.PATH, say isolation:claim_race.executor, one.)
# Editions: the behaviour suites (pgtap, isolation) run against the C++ edition and then
# against the portable edition (portable/, SQL and PL/pgSQL) on a server where the C++
# library is neither preloaded nor created, recorded as pgtap-portable, isolation-portable,
# ...; a file with a line "-- Edition: C++ only" (pgTAP) or "# Edition: C++ only" (spec) is
# about the C++ edition alone and is not run against the portable one. IDEM_EDITIONS="cpp"
# or "portable" runs one edition only (default: both).
# No argument runs everything. Ends with one line "N passed, N failed"; exits non-zero
# when anything failed or a suite could not run. Counting: one per regress test, per
# isolation spec, per pgTAP assertion, per TAP file, plus the extra suites' own counts.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

SUITE_TIMEOUT="${IDEM_SUITE_TIMEOUT:-900}"
TOTAL_PASSED=0
TOTAL_FAILED=0
SUMMARY=()

# --- selection -------------------------------------------------------------------------

declare -A WANT=()
for arg in "$@"; do
  case "${arg%%:*}" in
    regress | isolation | pgtap | tap | suites) ;;
    *) idem_die "unknown suite '${arg%%:*}' (regress, isolation, pgtap, tap, suites)" ;;
  esac
  WANT["${arg%%:*}"]+="${arg#*:} "
  [[ $arg == *:* ]] || WANT["$arg"]="ALL"
done
wanted_suite() { (($# == 0)) && return 1; [[ ${#WANT[@]} == 0 || -n ${WANT[$1]:-} ]]; }
# wanted NAME SUITE: is this test of SUITE selected?
wanted() {
  [[ ${#WANT[@]} == 0 ]] && return 0
  local sel="${WANT[$2]:-}" w
  for w in $sel; do [[ $w == ALL || $w == "$1" ]] && return 0; done
  return 1
}

# selected SUITE EXT FILE...: the FILEs (one per line) whose names, without directory and
# EXT, are selected for SUITE; a pattern that matched nothing is skipped.
selected() {
  local suite="$1" ext="$2" f
  shift 2
  for f in "$@"; do
    [[ -e $f ]] && wanted "$(basename "$f" "$ext")" "$suite" && printf '%s\n' "$f"
  done
  return 0
}

# --- editions --------------------------------------------------------------------------

IDEM_EDITIONS="${IDEM_EDITIONS:-cpp portable}"
edition_wanted() { [[ " $IDEM_EDITIONS " == *" $1 "* ]]; }
# A test file about the C++ edition alone.
CPP_ONLY_MARK='^(--|#) Edition: C\+\+ only'
cpp_only() { grep -qE "$CPP_ONLY_MARK" "$1"; }
# A test file about the portable edition alone ("-- Edition: portable only").
portable_only() { grep -qE '^(--|#) Edition: portable only' "$1"; }
# portable_copy FILE OUT: FILE for the portable edition: the assertions between the lines
# "-- C++ edition only, from here" and "-- C++ edition only, to here" left out, and its plan
# counted as it runs (no_plan: pgtap_run still counts a file that stops early as failed).
portable_copy() {
  as_pg perl -ne '
    if (/^-- C\+\+ edition only, from here/) { $skip = 1; next }
    if (/^-- C\+\+ edition only, to here/) { $skip = 0; next }
    next if $skip;
    s/^SELECT plan\(\d+\);/SELECT * FROM no_plan();/;
    print;' "$1" | as_pg tee "$2" >/dev/null
}
portable_script() { printf '%s\n' "$IDEM_SRC/portable/dist/idempotency-portable.sql"; }

# portable_cluster_start DIR: a server without the C++ library, whose template1 holds the
# portable edition (installed with psql -f), so that every database made by a test has it.
portable_cluster_start() {
  cluster_start "$1" "" "shared_preload_libraries = ''" || return 1
  pg_psql -d template1 -f "$(portable_script)" >/dev/null
}

# --- helpers ---------------------------------------------------------------------------

record() { # SUITE PASSED FAILED NOTE
  TOTAL_PASSED=$((TOTAL_PASSED + $2))
  TOTAL_FAILED=$((TOTAL_FAILED + $3))
  SUMMARY+=("$(printf '%-20s %4d passed, %4d failed%s' "$1" "$2" "$3" "${4:+  $4}")")
  printf '%s: %d passed, %d failed%s\n\n' "$1" "$2" "$3" "${4:+ $4}"
}

indent() { sed -u 's/^/    /'; }

# run_child LOG CMD...: runs CMD in its own process group (so that the EXIT trap can end
# all of it), with a timeout, its output indented on stdout and kept in LOG.
run_child() {
  local log="$1" rc
  shift
  set -m
  (
    set +m
    # timeout runs programs only: shell functions (as_pg) go through an exported copy.
    if declare -F "$1" >/dev/null; then set -- bash -c '"$@"' run_child "$@"; fi
    timeout --foreground -k 10 "$SUITE_TIMEOUT" "$@" 2>&1 | tee "$log" | indent
    exit "${PIPESTATUS[0]}"
  ) &
  local pid=$!
  set +m
  IDEM_BG_PIDS+=("$pid")
  wait "$pid"
  rc=$?
  local -a keep=()
  local p
  for p in "${IDEM_BG_PIDS[@]}"; do [[ $p == "$pid" ]] || keep+=("$p"); done
  IDEM_BG_PIDS=("${keep[@]}")
  ((rc == 124)) && printf '    (timed out after %ss)\n' "$SUITE_TIMEOUT"
  return "$rc"
}

show_file() { # TITLE FILE [LINES]
  [[ -s $2 ]] || return 0
  printf '    --- %s (%s, last %s lines) ---\n' "$1" "$2" "${3:-60}"
  tail -n "${3:-60}" "$2" | indent
}

# Parses pg_regress / pg_isolation_regress output (PostgreSQL 15 and 16+ formats) into
# "PASSED FAILED".
count_regress_output() {
  awk '
    /^(test| ) *[^ ]+ +\.\.\. +ok/ { p++; next }
    /^(test| ) *[^ ]+ +\.\.\. +failed \(ignored\)/ { p++; next }
    /^(test| ) *[^ ]+ +\.\.\. +FAILED/ { f++; next }
    /^ok +[0-9]+ +[-+] / { p++; next }
    /^not ok +[0-9]+ +[-+] / { f++; next }
    END { printf "%d %d\n", p, f }' "$1"
}

# --- pg_regress and pg_isolation_regress -------------------------------------------------

# run_regress_like SUITE TOOL INPUTDIR SUBDIR EXT TESTS...
run_regress_like() {
  local suite="$1" tool="$2" inputdir="$3"
  local out="$IDEM_SCRATCH/$suite"
  shift 3
  local -a tests=("$@")
  echo "== $suite: ${#tests[@]} test(s) (${tests[*]})"
  as_pg mkdir -p "$out"
  local rc=0
  run_child "$out/run.log" as_pg "$tool" \
    --temp-instance="$out/tmp_check" \
    --temp-config="$IDEM_SRC/test/regress.conf" \
    --inputdir="$inputdir" --outputdir="$out" \
    --bindir="$IDEM_PG_BIN" \
    --dbname=contrib_regression --load-extension=idempotency \
    --encoding=UTF8 --no-locale \
    "${tests[@]}" || rc=$?
  local passed failed
  read -r passed failed < <(count_regress_output "$out/run.log")
  local note=""
  if ((passed + failed == 0)); then
    failed=1 note="(could not run: exit $rc)"
    show_file "initdb log" "$out/log/initdb.log" 30
    show_file "server log" "$out/log/postmaster.log" 30
  elif ((rc != 0 && failed == 0)); then
    failed=1 note="(exit $rc)"
  fi
  if ((failed > 0)); then
    show_file "diffs" "$out/regression.diffs" 200
  fi
  record "$suite" "$passed" "$failed" "$note"
}

suite_regress() {
  local -a tests=()
  mapfile -t tests < <(selected regress .sql "$IDEM_SRC"/sql/*.sql)
  tests=("${tests[@]##*/}")
  tests=("${tests[@]%.sql}")
  if ((${#tests[@]} == 0)); then record regress 0 0 "(no tests)"; return; fi
  run_regress_like regress "$IDEM_PG_REGRESS" "$IDEM_SRC" "${tests[@]}"
}

suite_isolation() {
  edition_wanted cpp && suite_isolation_cpp
  edition_wanted portable && suite_isolation_portable
  return 0
}

suite_isolation_cpp() {
  local -a specs=() tests=()
  local spec name path
  specs=("$IDEM_SRC"/test/isolation/specs/*.spec)
  for spec in "${specs[@]}"; do
    name="$(basename "$spec" .spec)"
    [[ -e $spec ]] && wanted "$name" isolation && tests+=("$name")
  done
  # Then on the other paths, after every direct run (so that a path's setup left behind by
  # a failed check cannot change what the direct runs test).
  for path in $(test_paths); do
    for spec in "${specs[@]}"; do
      name="$(basename "$spec" .spec)"
      [[ -e $spec ]] && { wanted "$name" isolation || wanted "$name.$path" isolation; } &&
        tests+=("$name.$path")
    done
  done
  if ((${#tests[@]} == 0)); then
    echo "== isolation: no specs in test/isolation/specs/"
    record isolation 0 0 "(no specs yet)"
    return
  fi
  local input="$IDEM_SCRATCH/isolation-input"
  if ! isolation_input "$input" "${tests[@]}"; then
    record isolation 0 1 "(could not generate the specs of the other paths)"
    return
  fi
  run_regress_like isolation "$IDEM_PG_ISOLATION_REGRESS" "$input" "${tests[@]}"
  # Then every spec, on every path, again at the two other isolation levels: each session's
  # transactions default to the level (a step that names its level keeps it). A spec whose
  # answers change with the level has test/isolation/expected/NAME.LEVEL.out (LEVEL with _
  # for spaces), which is then the answer accepted at that level (with NAME.LEVEL_N.out
  # where the schedule's timing decides between two correct answers at that level).
  local level tag test name out variant
  for level in "repeatable read" "serializable"; do
    tag="${level// /_}"
    input="$IDEM_SCRATCH/isolation-input-$tag"
    if ! isolation_input "$input" "${tests[@]}"; then
      record "isolation-$tag" 0 1 "(could not generate the specs)"
      continue
    fi
    for test in "${tests[@]}"; do
      name="${test%%.*}"
      if [[ -e "$IDEM_SRC/test/isolation/expected/$name.$tag.out" ]]; then
        as_pg rm -f "$input/expected/$test".out "$input/expected/$test"_[0-9]*.out
        for out in "$IDEM_SRC/test/isolation/expected/$name.$tag".out \
          "$IDEM_SRC/test/isolation/expected/$name.$tag"_[0-9]*.out; do
          [[ -e $out ]] || continue
          variant="$(basename "$out" .out)"
          variant="${variant#"$name.$tag"}" # "" or _N: where timing decides between two answers
          as_pg cp "$out" "$input/expected/$test$variant.out" || return 1
        done
      fi
    done
    PGOPTIONS="-c default_transaction_isolation=${level// /\\ }" \
      run_regress_like "isolation-$tag" "$IDEM_PG_ISOLATION_REGRESS" "$input" "${tests[@]}"
  done
}

# The isolation specs against the portable edition, at the three levels, on a server of
# portable_cluster_start: each spec as it is (its CREATE EXTENSION line dropped: the schema
# is there already) with the same expected answers as the C++ edition's direct runs.
suite_isolation_portable() {
  local -a tests=()
  local spec name
  for spec in "$IDEM_SRC"/test/isolation/specs/*.spec; do
    name="$(basename "$spec" .spec)"
    [[ -e $spec ]] && wanted "$name" isolation && ! cpp_only "$spec" && tests+=("$name")
  done
  ((${#tests[@]})) || return 0
  local dir="$IDEM_SCRATCH/isolation-portable-server"
  if ! portable_cluster_start "$dir"; then
    record isolation-portable 0 1 "(could not start a server with the portable edition)"
    return
  fi
  local level tag suite input test out variant
  for level in "read committed" "repeatable read" "serializable"; do
    tag="${level// /_}"
    suite="isolation-portable"
    [[ $level == "read committed" ]] || suite="isolation-portable-$tag"
    input="$IDEM_SCRATCH/isolation-portable-input-$tag"
    if ! isolation_input "$input" "${tests[@]}"; then
      record "$suite" 0 1 "(could not copy the specs)"
      continue
    fi
    as_pg sed -i -E 's/^([[:space:]]*)CREATE EXTENSION IF NOT EXISTS idempotency;/\1RESET client_min_messages; -- the portable edition is in template1/' "$input"/specs/*.spec
    if [[ $level != "read committed" ]]; then
      for test in "${tests[@]}"; do
        if [[ -e "$IDEM_SRC/test/isolation/expected/$test.$tag.out" ]]; then
          as_pg rm -f "$input/expected/$test".out "$input/expected/$test"_[0-9]*.out
          for out in "$IDEM_SRC/test/isolation/expected/$test.$tag".out \
            "$IDEM_SRC/test/isolation/expected/$test.$tag"_[0-9]*.out; do
            [[ -e $out ]] || continue
            variant="$(basename "$out" .out)"
            variant="${variant#"$test.$tag"}"
            as_pg cp "$out" "$input/expected/$test$variant.out" || return 1
          done
        fi
      done
    fi
    PGOPTIONS="-c default_transaction_isolation=${level// /\\ }" \
      run_existing_like "$suite" "$IDEM_PG_ISOLATION_REGRESS" "$input" "${tests[@]}"
  done
  cluster_stop "$dir"
}

# run_existing_like SUITE TOOL INPUTDIR TESTS...: as run_regress_like, against the server of
# the last cluster_start (PGHOST / PGPORT) instead of a temporary instance.
run_existing_like() {
  local suite="$1" tool="$2" inputdir="$3"
  local out="$IDEM_SCRATCH/$suite"
  shift 3
  echo "== $suite: $# test(s) ($*)"
  as_pg mkdir -p "$out"
  local rc=0
  pg_psql -d postgres -c "SET client_min_messages = warning" \
    -c "DROP DATABASE IF EXISTS ${suite//-/_} WITH (FORCE)" -c "CREATE DATABASE ${suite//-/_}" || rc=$?
  run_child "$out/run.log" as_pg "$tool" --use-existing \
    --host="$PGHOST" --port="$PGPORT" --user=postgres \
    --inputdir="$inputdir" --outputdir="$out" --bindir="$IDEM_PG_BIN" \
    --dbname="${suite//-/_}" "$@" || rc=$?
  local passed failed note=""
  read -r passed failed < <(count_regress_output "$out/run.log")
  if ((passed + failed == 0)); then
    failed=1 note="(could not run: exit $rc)"
  elif ((rc != 0 && failed == 0)); then
    failed=1 note="(exit $rc)"
  fi
  ((failed > 0)) && show_file "diffs" "$out/regression.diffs" 200
  record "$suite" "$passed" "$failed" "$note"
}

# --- paths ---------------------------------------------------------------------------
# A claim writes its key by one of two paths: the direct heap path, or the executor (the
# kept SPI plans) that Citus and every table with a trigger, rule, CHECK, extra column or
# index takes. The tests of the claim core run on both, against the same expected results.
# Each path besides the direct one is a pair of files in test/paths/: PATH.setup.sql puts
# the table on that path before a test; PATH.check.sql, after it, fails unless the path
# was taken and undoes the setup; PATH.session.sql, if there is one, begins every session
# of an isolation spec (which connects before the setup runs). Every isolation spec NAME
# also runs as NAME.PATH, and every pgTAP file marked "-- On every path:" also runs in a
# database set up for PATH.

# The paths besides the direct one.
test_paths() {
  local f
  for f in "$IDEM_SRC"/test/paths/*.setup.sql; do
    [[ -e $f ]] && basename "$f" .setup.sql
  done
  return 0
}

# isolation_input DIR TEST...: an input directory for pg_isolation_regress: each spec NAME
# as it is, each NAME.PATH generated from it (the path's setup as a first setup block, its
# check at the end of the teardown block), and NAME's expected output files for both: a
# path that answers differently fails.
isolation_input() {
  local dir="$1" test name path out variant
  shift
  as_pg rm -rf "$dir"
  as_pg mkdir -p "$dir/specs" "$dir/expected" || return 1
  for test in "$@"; do
    name="${test%%.*}"
    path=""
    [[ $test == *.* ]] && path="${test#*.}"
    for out in "$IDEM_SRC/test/isolation/expected/$name".out "$IDEM_SRC/test/isolation/expected/${name}"_[0-9]*.out; do
      [[ -e $out ]] || continue
      variant="$(basename "$out" .out)"
      variant="${variant#"$name"}" # "" or _N
      as_pg cp "$out" "$dir/expected/$test$variant.out" || return 1
    done
    if [[ -z $path ]]; then
      as_pg cp "$IDEM_SRC/test/isolation/specs/$name.spec" "$dir/specs/" || return 1
      continue
    fi
    local generated session=/dev/null
    [[ -e $IDEM_SRC/test/paths/$path.session.sql ]] && session="$IDEM_SRC/test/paths/$path.session.sql"
    generated="$(perl -e '
      my ($spec, $setup, $check, $session) = map {
        open my $f, "<", $_ or die "$_: $!\n"; local $/; scalar <$f>
      } @ARGV;
      for ($setup, $check, $session) { die "a closing brace would end the spec block early\n" if /\}/ }
      my ($head) = split /^session\b/m, $spec, 2;
      if ($head =~ /^teardown\s*\{/m) {
        # The block runs as one implicit transaction: COMMIT keeps the spec'"'"'s own
        # teardown when the check fails.
        $spec =~ s/^(teardown\s*\{.*?)(\s*\})/$1\n  COMMIT;\n$check$2/ms or die "no teardown block\n";
      } else {
        $spec =~ s/^(?=session\b)/teardown\n{\n$check}\n\n/m or die "no session\n";
      }
      # The sessions are connected before any setup runs: each one begins with the
      # path'"'"'s session setup (then its own setup block, if it has one).
      if ($session =~ /\S/) {
        $spec =~ s/^(session\s+\S+[^\n]*\n)((?:[ \t]*(?:#[^\n]*)?\n)*)(setup\s*\{)?/
          defined $3 ? "$1$2$3\n$session" : "$1setup\n{\n$session}\n$2"/gme;
      }
      my @names = map { s{.*/test/}{test/}r } @ARGV;
      print "# Generated by test/run.sh: $names[0] with $names[1] and $names[2]\n",
            "setup\n{\n$setup}\n\n$spec";
    ' "$IDEM_SRC/test/isolation/specs/$name.spec" "$IDEM_SRC/test/paths/$path.setup.sql" \
      "$IDEM_SRC/test/paths/$path.check.sql" "$session")" || return 1
    printf '%s\n' "$generated" | as_pg tee "$dir/specs/$test.spec" >/dev/null || return 1
  done
}

# --- pgTAP -------------------------------------------------------------------------------

# A pgTAP file with a line starting so runs on every path (see "paths" above).
PGTAP_EVERY_PATH='^-- On every path:'

# pgtap_run FILE [PATH]: runs FILE in a fresh database, set up for PATH if one is given;
# adds its assertions to passed / failed (variables of suite_pgtap) and leaves its result
# lines in $dir/NAME[.PATH].tap. On another path, two more checks: the path was taken,
# and the result lines are those of the direct run (when that ran too).
pgtap_run() {
  local f="$1" path="${2:-}" name test db log rc ok notok plan missing
  name="$(basename "$f" .sql)"
  test="$name${path:+.$path}"
  db="pgtap_${test//[^a-zA-Z0-9_]/_}"
  log="$dir/$test.log"
  echo "  -- $test"
  if ! pg_psql -d postgres -c "SET client_min_messages = warning" \
    -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db" ||
    ! pg_psql -d "$db" -c 'CREATE EXTENSION pgtap' ||
    { [[ $edition == cpp ]] && ! pg_psql -d "$db" -c 'CREATE EXTENSION idempotency'; } ||
    { [[ -n $path ]] && ! pg_psql -d "$db" -f "$IDEM_SRC/test/paths/$path.setup.sql"; }; then
    echo "    could not prepare database $db"
    failed=$((failed + 1))
    return
  fi
  rc=0
  run_child "$log" as_pg pg_prove --verbose --failures --timer \
    -h "$PGHOST" -p "$PGPORT" -U postgres -d "$db" "$f" || rc=$?
  ok=$(grep -cE '^ok [0-9]+' "$log")
  notok=$(grep -E '^not ok [0-9]+' "$log" | grep -vc '# TODO')
  plan=$(sed -nE 's/^1\.\.([0-9]+).*/\1/p' "$log" | head -1)
  missing=0
  [[ -n $plan ]] && ((plan > ok + notok)) && missing=$((plan - ok - notok))
  ((rc != 0 && notok + missing == 0)) && missing=1
  passed=$((passed + ok))
  failed=$((failed + notok + missing))
  ((missing > 0)) && echo "    $test: $missing assertion(s) did not run or the file failed (exit $rc)"
  grep -E '^(not )?ok [0-9]+' "$log" >"$dir/$test.tap"
  if [[ -n $path ]]; then
    if pg_psql -d "$db" -f "$IDEM_SRC/test/paths/$path.check.sql"; then
      passed=$((passed + 1))
    else
      echo "    $test: the $path path was not taken ($path.check.sql failed)"
      failed=$((failed + 1))
    fi
    if [[ -e $dir/$name.tap ]]; then
      if diff -U0 "$dir/$name.tap" "$dir/$test.tap" >"$dir/$test.diff"; then
        passed=$((passed + 1))
      else
        echo "    $test: results differ from the direct path's ($name):"
        indent <"$dir/$test.diff"
        failed=$((failed + 1))
      fi
    fi
  fi
  pg_psql -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" || true
}

suite_pgtap() {
  edition_wanted cpp && suite_pgtap_cpp
  edition_wanted portable && suite_pgtap_portable
  return 0
}

# Every pgTAP file not marked "-- Edition: C++ only", against the portable edition (its
# databases made from a template1 that holds it), with the same assertions.
suite_pgtap_portable() {
  local -a runs=()
  local f name
  for f in "$IDEM_SRC"/test/pgtap/*.sql; do
    [[ -e $f ]] || continue
    name="$(basename "$f" .sql)"
    wanted "$name" pgtap && ! cpp_only "$f" && runs+=("$f")
  done
  local copies="$IDEM_SCRATCH/pgtap-portable-files"
  as_pg mkdir -p "$copies"
  local i
  for i in "${!runs[@]}"; do
    portable_copy "${runs[$i]}" "$copies/$(basename "${runs[$i]}")"
    runs[$i]="$copies/$(basename "${runs[$i]}")"
  done
  ((${#runs[@]})) || return 0
  echo "== pgtap-portable: ${#runs[@]} file(s) against the portable edition, counting assertions"
  local dir="$IDEM_SCRATCH/pgtap-portable"
  if ! portable_cluster_start "$dir"; then
    record pgtap-portable 0 1 "(could not start a server with the portable edition)"
    return
  fi
  local passed=0 failed=0 edition=portable
  for f in "${runs[@]}"; do pgtap_run "$f"; done
  ((failed > 0)) && show_file "server log" "$dir/server.log" 40
  cluster_stop "$dir"
  record pgtap-portable "$passed" "$failed" "(assertions)"
}

suite_pgtap_cpp() {
  local -a runs=()
  local f name path
  for f in "$IDEM_SRC"/test/pgtap/*.sql; do
    [[ -e $f ]] || continue
    name="$(basename "$f" .sql)"
    portable_only "$f" && continue
    wanted "$name" pgtap && runs+=("$f|")
    grep -q "$PGTAP_EVERY_PATH" "$f" || continue
    for path in $(test_paths); do
      { wanted "$name" pgtap || wanted "$name.$path" pgtap; } && runs+=("$f|$path")
    done
  done
  if ((${#runs[@]} == 0)); then record pgtap 0 0 "(no files)"; return; fi
  echo "== pgtap: ${#runs[@]} run(s) of test/pgtap/*.sql, counting assertions"
  local dir="$IDEM_SCRATCH/pgtap"
  if ! cluster_start "$dir" "" "idempotency.cleanup_interval = '1s'"; then
    record pgtap 0 1 "(could not start a server)"
    return
  fi
  local passed=0 failed=0 run edition=cpp
  for run in "${runs[@]}"; do pgtap_run "${run%|*}" "${run##*|}"; done
  ((failed > 0)) && show_file "server log" "$dir/server.log" 40
  cluster_stop "$dir"
  record pgtap "$passed" "$failed" "(assertions)"
}

# --- Perl TAP (PostgreSQL::Test::Cluster) ------------------------------------------------

suite_tap() {
  local -a files=()
  local f
  mapfile -t files < <(selected tap .pl "$IDEM_SRC"/test/t/*.pl)
  if ((${#files[@]} == 0)); then record tap 0 0 "(no files)"; return; fi
  echo "== tap: ${#files[@]} file(s), counting files"
  local passed=0 failed=0 name testdir rc
  for f in "${files[@]}"; do
    name="$(basename "$f" .pl)"
    testdir="$IDEM_SCRATCH/tap/$name"
    as_pg mkdir -p "$testdir"
    rc=0
    # What PostgreSQL's own `make check` (prove_check) sets for Cluster.pm in PG 15.
    run_child "$testdir/prove.log" as_pg env \
      PERL5LIB="$IDEM_SRC/test/t:$IDEM_PERL_TEST_LIB${PERL5LIB:+:$PERL5LIB}" \
      PG_REGRESS="$IDEM_PG_REGRESS" \
      TESTDIR="$testdir" TESTDATADIR="$testdir/tmp_check" \
      TEMP_CONFIG="$IDEM_SRC/test/regress.conf" \
      PG_TEST_TIMEOUT_DEFAULT="${PG_TEST_TIMEOUT_DEFAULT:-120}" \
      IDEM_SRC="$IDEM_SRC" \
      prove --verbose --timer "$f" || rc=$?
    if ((rc == 0)); then
      passed=$((passed + 1))
    else
      failed=$((failed + 1))
      local log
      for log in "$testdir"/tmp_check/log/*; do
        [[ -f $log ]] && show_file "$(basename "$log")" "$log" 40
      done
    fi
  done
  record tap "$passed" "$failed" "(files)"
}

# --- extra suites (test/suites/*.sh) ----------------------------------------------------

suite_suites() {
  local f name dir rc p fl line skipped
  local -a files=()
  mapfile -t files < <(selected suites .sh "$IDEM_ROOT"/test/suites/*.sh)
  for f in "${files[@]}"; do
    name="$(basename "$f" .sh)"
    echo "== suite $name"
    dir="$IDEM_SCRATCH/suites/$name"
    mkdir -p "$dir"
    idem_is_root && chown postgres: "$dir"
    rc=0
    # Each suite gets its own scratch dir; the build is done already.
    run_child "$IDEM_SCRATCH/suites/$name.log" env IDEM_SCRATCH="$dir" IDEM_SRC="$IDEM_SRC" \
      IDEM_BUILT=1 bash "$f" || rc=$?
    line="$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$IDEM_SCRATCH/suites/$name.log" | tail -1)"
    if [[ -n $line ]]; then
      read -r p _ fl _ <<<"$line"
      ((rc != 0 && fl == 0)) && fl=1 && echo "    (exit $rc although it reported no failure)"
      # A suite that cannot run here (what it needs is not installed) says "# skipped: WHY".
      skipped="$(sed -nE 's/^# skipped: (.*)$/\1/p' "$IDEM_SCRATCH/suites/$name.log" | head -1)"
      record "suite:$name" "$p" "$fl" "${skipped:+(skipped: $skipped)}"
    else
      record "suite:$name" 0 1 "(no summary line; exit $rc)"
    fi
    idem_stop_servers_under "$dir"
  done
  ((${#files[@]})) || record suites 0 0 "(none in test/suites/)"
}

# --- main --------------------------------------------------------------------------------

START=$SECONDS
ensure_packages
build_and_install
idem_scratch_init
echo "scratch: $IDEM_SCRATCH"
echo

for suite in regress isolation pgtap tap suites; do
  wanted_suite "$suite" && "suite_$suite"
done

echo "== summary ($((SECONDS - START)) s)"
printf '  %s\n' "${SUMMARY[@]}"
echo "$TOTAL_PASSED passed, $TOTAL_FAILED failed"
((TOTAL_FAILED == 0))
