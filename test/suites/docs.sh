#!/usr/bin/env bash
# Suite: the documentation cannot drift (test/docs/mdblocks.py says the conventions).
#   - every page renders as written (every fence closed), every shell block says which
#     script runs it (or why none does), excerpts are word for word in their files, relative
#     links and their anchors resolve; self-tests: a fence with text after it and a fence
#     never closed are both found
#   - every SQL block of README.md, CONTRIBUTING.md, examples/README.md and docs/*.md runs, in
#     page order, as the role and in the database its first line names (app by default), on a
#     server configured with the ini blocks of README.md and docs/operations.md (pg_cron and
#     idempotency preloaded), whose search_path does not name the extension's schema; a block
#     followed by a ```text block must print exactly that. The pg_cron job of
#     docs/operations.md runs for real (cron.job_run_details)
#   - the README's table of the statistics view lists the view's columns in the view's order
#   - the prometheus-postgres-exporter settings of docs/operations.md, with
#     examples/monitoring/queries.yaml, serve the statistics as metrics: the exporter, connected
#     as a pg_monitor member that is not a superuser, is scraped over HTTP on 127.0.0.1 and
#     answers the view's numbers; every metric of the README's scrape is served
#   - self-test: the README with one character of its first output block changed must fail
# Ends with "N passed, N failed".
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
IDEM_PACKAGES+=(prometheus-postgres-exporter curl)
# pg_cron comes from Debian's archive for Debian's server; a server built from source has none.
idem_debian_server && IDEM_PACKAGES+=("postgresql-${IDEM_PG_MAJOR}-cron")
ensure_packages
build_and_install
idem_scratch_init
cd "$IDEM_ROOT"

MD=(README.md CONTRIBUTING.md CHANGELOG.md SECURITY.md examples/README.md docs/*.md)
TOOL=(/usr/bin/python3 "$IDEM_ROOT/test/docs/mdblocks.py")
PASSED=0 FAILED=0
pass() { echo "ok - $1"; PASSED=$((PASSED + 1)); }
fail() { echo "not ok - $1"; FAILED=$((FAILED + 1)); }

"${TOOL[@]}" static "${MD[@]}" | tee "$IDEM_SCRATCH/static.log"
idem_count_run "$IDEM_SCRATCH/static.log"

echo "# self-test: the render check finds a fence that does not close and one never closed"
mkdir -p "$IDEM_SCRATCH/render"
printf '# t\n\n```sh\nmake\n``` Then text on the fence line.\n\n## After\n' >"$IDEM_SCRATCH/render/text-after.md"
printf '# t\n\n```sql\nSELECT 1;\n\n## After\n' >"$IDEM_SCRATCH/render/unclosed.md"
for page in text-after unclosed; do
  "${TOOL[@]}" static "$IDEM_SCRATCH/render/$page.md" >"$IDEM_SCRATCH/render/$page.log" 2>&1
  if grep -q 'never closed' "$IDEM_SCRATCH/render/$page.log"; then
    pass "the render check finds the broken fence of $page.md"
  else
    sed 's/^/    | /' "$IDEM_SCRATCH/render/$page.log"
    fail "the render check missed the broken fence of $page.md"
  fi
done

# --- the server, as the README and docs/operations.md configure it --------------------------
# The pages that configure the server: README.md preloads idempotency, docs/operations.md adds
# pg_cron (its settings win where both name one).
CONF_PAGES=(README.md docs/operations.md)
mapfile -t CONF < <("${TOOL[@]}" config "${CONF_PAGES[@]}")
if [[ ! -e $("$IDEM_PG_CONFIG" --pkglibdir)/pg_cron.so ]]; then
  # Only for a server built from source (Debian's gets postgresql-NN-cron above).
  echo "# pg_cron is not installed for $("$IDEM_PG_CONFIG" --version): its blocks are skipped"
  mapfile -t CONF < <(printf '%s\n' "${CONF[@]}" | grep -v '^cron\.' |
    sed -E "s/^(shared_preload_libraries = ')pg_cron,/\1/")
  export DOCS_SKIP='\bcron\.' DOCS_SKIP_WHY="pg_cron is not installed for this server"
fi
echo "# postgresql.conf from ${CONF_PAGES[*]}:"
printf '#   %s\n' "${CONF[@]}"
port="$(idem_free_port 5490 5499)" || idem_die "no free port in 5490-5499"
# A server as users have it: its search_path does not name the extension's schema. The
# cleanup worker's rounds are an hour apart, so that the statistics rows of the databases
# dropped during the suite stay until the scrape below (a round forgets them).
cluster_start "$IDEM_SCRATCH/pg" "$port" "${CONF[@]}" "search_path = '\"\$user\", public'" \
  "idempotency.cleanup_interval = '1h'" || idem_die "could not start a server"
q() { psql -X -qAt -v ON_ERROR_STOP=1 "$@"; }

# The statistics view for monitoring roles is new in 1.2. Until the extension's script makes
# it, the suite puts a stand-in after every install (the same rows, readable by pg_monitor,
# members of the extension as the real ones are).
q -c "CREATE DATABASE docs_probe" -d postgres
q -d docs_probe -c "CREATE EXTENSION idempotency"
if [[ -z $(q -d docs_probe -c "SELECT to_regclass('idempotency_monitor.idempotency_stats')") ]]; then
  echo "# idempotency_monitor.idempotency_stats is missing from the extension: a stand-in is made after each install"
  cat >"$IDEM_SCRATCH/after-install.sql" <<'SQL'
CREATE SCHEMA idempotency_monitor;
CREATE VIEW idempotency_monitor.idempotency_stats AS SELECT * FROM idempotency.idempotency_stats;
GRANT USAGE ON SCHEMA idempotency_monitor TO pg_monitor;
GRANT SELECT ON idempotency_monitor.idempotency_stats TO pg_monitor;
ALTER EXTENSION idempotency ADD SCHEMA idempotency_monitor;  -- DROP EXTENSION drops them
ALTER EXTENSION idempotency ADD VIEW idempotency_monitor.idempotency_stats;
SQL
  export DOCS_AFTER_INSTALL="$IDEM_SCRATCH/after-install.sql"
fi
q -c "DROP DATABASE docs_probe" -d postgres

"${TOOL[@]}" check "${MD[@]}" | tee "$IDEM_SCRATCH/check.log"
idem_count_run "$IDEM_SCRATCH/check.log"

# --- the statistics view's columns, as the README lists them --------------------------------
echo "# README.md, Statistics: the columns of idempotency_monitor.idempotency_stats, in order"
documented="$("${TOOL[@]}" columns README.md Statistics | paste -sd' ')"
actual="$(q -d app -c "SELECT attname FROM pg_attribute WHERE attnum > 0 AND NOT attisdropped
                         AND attrelid = 'idempotency_monitor.idempotency_stats'::regclass ORDER BY attnum" | paste -sd' ')"
if [[ -n $actual && $documented == "$actual" ]]; then
  pass "the README lists the view's columns in the view's order"
else
  printf '    | README: %s\n    | view:   %s\n' "$documented" "$actual"
  fail "the README's columns of the statistics view are not the view's"
fi

# --- Prometheus: the exporter settings of docs/operations.md, scraped over HTTP -------------
EXPORTER_PAGE=docs/operations.md
echo "# $EXPORTER_PAGE, Prometheus: prometheus-postgres-exporter with examples/monitoring/queries.yaml"
settings="$("${TOOL[@]}" block "$EXPORTER_PAGE" DATA_SOURCE_NAME=)"
dsn="$(sed -n "s/.*DATA_SOURCE_NAME='\([^']*\)'.*/\1/p" <<<"$settings")"
args="$(sed -n "s/.*ARGS='\([^']*\)'.*/\1/p" <<<"$settings")"
queries="$(sed -n 's/.*--extend.query-path=\([^ ]*\).*/\1/p' <<<"$args")"
exporter_role="$(sed -n 's/.*user=\([^ ]*\).*/\1/p' <<<"$dsn")"
if [[ -n $dsn && -n $queries ]] && grep -qF "examples/monitoring/queries.yaml $queries" <<<"$settings"; then
  pass "$EXPORTER_PAGE installs examples/monitoring/queries.yaml where its ARGS read it ($queries)"
else
  printf '    | %s\n' "$settings"
  fail "the exporter settings of $EXPORTER_PAGE: DATA_SOURCE_NAME, ARGS and the queries file they name"
fi
# This server instead of Debian's: its socket directory and port; the file from the tree.
dsn="${dsn/host=\/run\/postgresql/host=$PGHOST port=$PGPORT}"
args="${args/$queries/$IDEM_ROOT/examples/monitoring/queries.yaml}"
check_role="$(q -d app -c "SELECT rolsuper::text || ' ' || pg_has_role(oid, 'pg_monitor', 'member')::text
                             FROM pg_roles WHERE rolname = '$exporter_role'")"
if [[ $check_role == "false true" ]]; then
  pass "the exporter's role $exporter_role is a member of pg_monitor and not a superuser"
else
  fail "the exporter's role $exporter_role: superuser, pg_monitor member = '$check_role' (want: false true)"
fi
# Something to count, a different number of each, so that a metric read from another column
# shows: claimed 5, reclaimed 2, replayed 7, in_progress 4, mismatched 6, completed 1, released 3.
# It counts from zero in a database app of its own: the pages' blocks counted in theirs.
# Beside it, two databases that counted a claim and were dropped: their rows, without a name
# until the worker's next round, are in the view while the exporter is scraped.
fresh_app() { # DATABASE: made anew, owned by app, with the extension and app's grant
  q -d postgres -c "DROP DATABASE IF EXISTS $1 WITH (FORCE)" -c "CREATE DATABASE $1 OWNER app"
  q -d "$1" -c "CREATE EXTENSION idempotency" -c "GRANT USAGE ON SCHEMA idempotency TO app"
  [[ -z ${DOCS_AFTER_INSTALL:-} ]] || q -d "$1" -f "$DOCS_AFTER_INSTALL"
}
for gone in docs_gone_1 docs_gone_2; do
  fresh_app "$gone"
  q -U app -d "$gone" -c "SELECT status FROM idempotency.claim_key('docs-gone'::text)" >/dev/null
  q -d postgres -c "DROP DATABASE $gone"
done
fresh_app app
workload="5 2 7 4 6 1 3"
q -U app -d app >/dev/null <<'SQL'
SELECT token AS t FROM idempotency.claim_key('docs-a'::text, '\x01'::bytea) \gset
SELECT idempotency.complete_key('docs-a'::text, :'t'::uuid, '{}'::jsonb);
SELECT idempotency.claim_key(k) FROM unnest(ARRAY['docs-b', 'docs-c', 'docs-d']::text[]) k;
SELECT token AS e FROM idempotency.claim_key('docs-e'::text) \gset
SELECT idempotency.release_key('docs-e'::text, :'e'::uuid);
SELECT token AS e FROM idempotency.claim_key('docs-e'::text) \gset
SELECT idempotency.release_key('docs-e'::text, :'e'::uuid);
SELECT token AS e FROM idempotency.claim_key('docs-e'::text) \gset
SELECT idempotency.release_key('docs-e'::text, :'e'::uuid);
SELECT idempotency.claim_key('docs-a'::text, '\x01'::bytea) FROM generate_series(1, 7);
SELECT idempotency.claim_key('docs-a'::text, '\x02'::bytea) FROM generate_series(1, 6);
SELECT idempotency.claim_key('docs-d'::text) FROM generate_series(1, 4);
SQL
http="$(idem_free_port $((port + 1)) 5499)" || idem_die "no free port for the exporter in 5490-5499"
# shellcheck disable=SC2086  # ARGS is a list of flags, as the Debian service splits it
DATA_SOURCE_NAME="$dsn" idem_bg prometheus-postgres-exporter $args --web.listen-address="127.0.0.1:$http" \
  >"$IDEM_SCRATCH/exporter.log" 2>&1
scrape="$IDEM_SCRATCH/metrics.txt"
for _ in $(seq 300); do # until it listens (at most 30 s)
  curl -sf "http://127.0.0.1:$http/metrics" >"$scrape" && break
  sleep 0.1
done
stats="$(q -U "$exporter_role" -d app -F ' ' -c "SELECT claimed, reclaimed, replayed, in_progress, mismatched,
                completed, released FROM idempotency_monitor.idempotency_stats WHERE datname = 'app'")"
got=""
for metric in claimed reclaimed replayed in_progress mismatched completed released; do
  got+="$(sed -n "s/^idempotency_${metric}_total{datname=\"app\"[^}]*} \([0-9.e+]*\)$/\1/p" "$scrape") "
done
# The rows of the dropped databases were there during the scrape (only a round removes them).
dropped="$(q -d app -c "SELECT count(*) FROM idempotency_monitor.idempotency_stats WHERE datname IS NULL")"
if ((dropped >= 2)) && [[ -s $scrape ]]; then
  pass "the exporter serves its scrape while the view holds $dropped rows of dropped databases"
else
  fail "the scrape with $dropped rows of dropped databases in the view: $(wc -c <"$scrape") bytes served"
fi
if [[ $stats == "$workload" && "${got% }" == "$stats" ]]; then
  pass "the scrape answers the view's counts for app (claimed .. released: $stats)"
else
  sed 's/^/    | /' "$IDEM_SCRATCH/exporter.log"
  grep '^idempotency_' "$scrape" | sed 's/^/    | /'
  fail "the scrape's counts for app ('${got% }'), the view's ('$stats') and the workload's ('$workload') differ"
fi
# Every metric the README's scrape shows is there, with the labels it shows.
shown="$("${TOOL[@]}" output README.md "localhost:9187/metrics" | sed -E 's/,?server="[^"]*"//; s/ [^ ]+$//' | sort -u)"
served="$(grep '^idempotency_' "$scrape" | sed -E 's/,?server="[^"]*"//; s/ [^ ]+$//' | sort -u)"
missing="$(comm -23 <(echo "$shown") <(echo "$served"))"
if [[ -n $shown && -z $missing ]]; then
  pass "every metric of the README's scrape is served ($(wc -l <<<"$shown") lines)"
else
  printf '    | not served: %s\n' "$missing"
  fail "the README's scrape shows metrics the exporter does not serve"
fi

echo "# self-test: README.md with its first output block changed"
"${TOOL[@]}" check README.md --mutate-first-output >"$IDEM_SCRATCH/mutated.log" 2>&1
if [[ $(grep -c '^not ok' "$IDEM_SCRATCH/mutated.log") == 1 ]] &&
  grep -qE '^[0-9]+ passed, 1 failed$' "$IDEM_SCRATCH/mutated.log"; then
  pass "an edited output block makes the suite fail"
else
  sed 's/^/    | /' "$IDEM_SCRATCH/mutated.log"
  fail "an edited output block went unnoticed"
fi

echo "${PASSED} passed, ${FAILED} failed"
((FAILED == 0))
