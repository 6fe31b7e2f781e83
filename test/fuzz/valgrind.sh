#!/usr/bin/env bash
# Memory-safety run (not part of `make test`: about 10-15 minutes): the server runs under
# valgrind memcheck while it executes
#   1. the pg_regress suite (sql/*.sql) and the isolation specs,
#   2. the hostile-input fuzz test (test/fuzz/fuzz.py, IDEM_VALGRIND=1),
#   3. the exactly-once harness, short, with kills and a server crash (test/chaos/chaos.py).
# Every valgrind error whose stack passes through idempotency.so fails the run; errors
# inside PostgreSQL alone are counted and listed as PostgreSQL's (its own valgrind.supp
# suppresses them in its builds). Usage: bash test/fuzz/valgrind.sh
#
# Why valgrind and not -fsanitize=address: an ASan-built module needs libasan preloaded
# into the postmaster, and on Debian 12 (GCC 12 libasan, glibc 2.36) `LD_PRELOAD=libasan.so
# postgres --version` already deadlocks in bindtextdomain (the known interceptor deadlock
# on glibc's _nl_state_lock), before any of our code runs.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
IDEM_PACKAGES+=(valgrind)
ensure_packages
build_and_install
idem_scratch_init

PASSED=0
FAILED=0
count_run() {
  local line p f
  line="$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$1" | tail -1)"
  if [[ -z $line ]]; then echo "not ok - $2 printed no summary"; FAILED=$((FAILED + 1)); return; fi
  read -r p _ f _ <<<"$line"
  PASSED=$((PASSED + p))
  FAILED=$((FAILED + f))
}

# 1. pg_regress against a server under valgrind.
dir="$IDEM_SCRATCH/valgrind-regress"
mkdir -p "$dir" && idem_is_root && chown postgres: "$dir"
cat >"$dir/postgres-under-valgrind.sh" <<WRAP
#!/bin/sh
exec valgrind --quiet --trace-children=yes --error-limit=no --num-callers=40 --read-var-info=no \
  --log-file=$dir/valgrind.%p.log $IDEM_PG_BIN/postgres "\$@"
WRAP
chmod 755 "$dir/postgres-under-valgrind.sh"
as_pg initdb -D "$dir/data" -U postgres -A trust -E UTF8 --no-locale --no-sync >/dev/null
cat "$IDEM_ROOT/test/regress.conf" - <<CONF | as_pg tee -a "$dir/data/postgresql.conf" >/dev/null
port = 5479
listen_addresses = ''
unix_socket_directories = '$dir'
CONF
IDEM_CLUSTERS+=("$dir")
as_pg pg_ctl -D "$dir/data" -l "$dir/server.log" -p "$dir/postgres-under-valgrind.sh" -w -t 600 start >/dev/null ||
  idem_die "the server under valgrind did not start"
mapfile -t tests < <(cd "$IDEM_SRC/sql" && ls *.sql | sed 's/\.sql$//')
# --use-existing creates no database and loads no extension: do it here.
as_pg psql -X -q -h "$dir" -p 5479 -d postgres -c 'CREATE DATABASE contrib_regression' &&
  as_pg psql -X -q -h "$dir" -p 5479 -d contrib_regression -c 'CREATE EXTENSION idempotency' ||
  idem_die "could not prepare contrib_regression"
as_pg "$IDEM_PG_REGRESS" --use-existing --host="$dir" --port=5479 --inputdir="$IDEM_SRC" --outputdir="$dir" \
  --bindir="$IDEM_PG_BIN" --dbname=contrib_regression "${tests[@]}" >"$dir/regress.log" 2>&1
cat "$dir/regress.log"
# The same expected output under valgrind (only slower).
read -r rp rf < <(awk '/ \.\.\. +ok/ {p++} / \.\.\. +FAILED/ {f++} END {print p+0, f+0}' "$dir/regress.log")
echo "regress under valgrind: $rp passed, $rf failed"
PASSED=$((PASSED + rp))
FAILED=$((FAILED + rf))
((rp + rf > 0)) || { echo "not ok - pg_regress did not run"; FAILED=$((FAILED + 1)); }
[[ -s $dir/regression.diffs ]] && head -100 "$dir/regression.diffs"
# The isolation specs (concurrent sessions) against the same server.
as_pg psql -X -q -h "$dir" -p 5479 -d postgres -c 'CREATE DATABASE isolation_regression' &&
  as_pg psql -X -q -h "$dir" -p 5479 -d isolation_regression -c 'CREATE EXTENSION idempotency' ||
  idem_die "could not prepare isolation_regression"
mapfile -t specs < <(cd "$IDEM_SRC/test/isolation/specs" && ls *.spec | sed 's/\.spec$//')
as_pg mkdir -p "$dir/isolation"
as_pg "$IDEM_PG_ISOLATION_REGRESS" --use-existing --host="$dir" --port=5479 --inputdir="$IDEM_SRC/test/isolation" \
  --outputdir="$dir/isolation" --bindir="$IDEM_PG_BIN" --dbname=isolation_regression "${specs[@]}" \
  >"$dir/isolation.log" 2>&1
cat "$dir/isolation.log"
read -r rp rf < <(awk '/ \.\.\. +ok/ {p++} / \.\.\. +FAILED/ {f++} END {print p+0, f+0}' "$dir/isolation.log")
echo "isolation under valgrind: $rp passed, $rf failed"
PASSED=$((PASSED + rp))
FAILED=$((FAILED + rf))
cluster_stop "$dir"
# The chaos harness's valgrind log reader judges the logs of this server too.
IDEM_VALGRIND=1 /usr/bin/python3 -c "
import importlib.util
spec = importlib.util.spec_from_file_location('chaos', '$IDEM_ROOT/test/chaos/chaos.py')
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
res = []
def check(ok, what):
    res.append(ok)
    print(('ok' if ok else 'not ok') + ' - regress: ' + what)
m.valgrind_checks(check, '$dir')
print('%d passed, %d failed' % (sum(res), len(res) - sum(res)))
" | tee "$dir/findings.log"
count_run "$dir/findings.log" "regress under valgrind"

# 2. and 3.: the harnesses start their own servers under valgrind.
mkdir -p "$IDEM_SCRATCH/valgrind-fuzz" "$IDEM_SCRATCH/valgrind-chaos"
IDEM_VALGRIND=1 /usr/bin/python3 "$IDEM_ROOT/test/fuzz/fuzz.py" --workdir "$IDEM_SCRATCH/valgrind-fuzz" \
  --port 5478 --calls "${IDEM_VALGRIND_CALLS:-400}" 2>&1 | tee "$IDEM_SCRATCH/valgrind-fuzz.log" | grep -v '^ok'
count_run "$IDEM_SCRATCH/valgrind-fuzz.log" fuzz
IDEM_VALGRIND=1 /usr/bin/python3 "$IDEM_ROOT/test/chaos/chaos.py" run --workdir "$IDEM_SCRATCH/valgrind-chaos" \
  --port 5476 --messages 120 --consumers 8 --crashes 1 --timeout 1200 2>&1 |
  tee "$IDEM_SCRATCH/valgrind-chaos.log" | grep -v '^ok'
count_run "$IDEM_SCRATCH/valgrind-chaos.log" chaos

echo "$PASSED passed, $FAILED failed"
((FAILED == 0))
