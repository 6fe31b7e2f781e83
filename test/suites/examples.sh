#!/usr/bin/env bash
# Suite: the client examples run against a throw-away server and do what they claim.
#   examples/README.md            every command runs as printed, from the top directory, in a
#                                 shell where the page's export line ran (this server's port
#                                 for 5432; app's password over TCP on localhost, as on
#                                 Debian), each on a fresh database `app` set up as the README
#                                 says, and prints what the page shows (free ports for the
#                                 Node examples' 3000 and 3001): the Python consumer, the
#                                 batch consumer, Go, the walkthrough (twice), the Node tests,
#                                 and the server in the background with a duplicate in flight
#   examples/python/consumer.py   also: two consumers racing on one message, as another role
#   examples/node                 HTTP Idempotency-Key endpoint, real requests (npm ci,
#                                 node --test): 400 / replay byte for byte / 409 / 422 /
#                                 concurrency
#   examples/go/inbox.go          pgx v4 from Debian's archive (golang-github-jackc-pgx-v4-dev)
#   examples/go/middleware        the Go package's net/http Idempotency-Key middleware around a
#                                 service (clients/go, built offline with clients/go/offline.sh): its
#                                 go test (real requests on 127.0.0.1: replays byte for byte,
#                                 409 / 422 / 400, 5xx not stored, concurrency) and the
#                                 receipts service run as a user runs it, asked twice by curl
#   examples/sql/walkthrough.sql  runs twice and prints exactly walkthrough.out
#   demo/demo.sql                 runs with psql -d demo and no PGDATABASE (make demo's script)
# The programs run as ordinary application roles, on a server whose search_path does not name
# the extension's schema: the examples work the way the README tells users to set things up.
# Ends with "N passed, N failed".
set -uo pipefail
source "$(dirname "$0")/../lib.sh"
# node and npm may come from elsewhere (nodesource); install Debian's only when absent.
command -v node >/dev/null || IDEM_PACKAGES+=(nodejs)
command -v npm >/dev/null || IDEM_PACKAGES+=(npm)
IDEM_PACKAGES+=(golang-go golang-github-jackc-pgx-v4-dev golang-github-rabbitmq-amqp091-go-dev)
ensure_packages
build_and_install
idem_scratch_init

EX="$IDEM_ROOT/examples"
PY=/usr/bin/python3 # Debian's python, which has python3-psycopg (not a pyenv shim)
passed=0 failed=0
ok() { echo "ok - $1"; passed=$((passed + 1)); }
not_ok() { echo "not ok - $1"; failed=$((failed + 1)); }
check() { # NAME CMD...: ok when CMD succeeds
  local name="$1"
  shift
  if "$@"; then ok "$name"; else not_ok "$name"; fi
}
# has FILE REGEX: FILE has a line matching REGEX (extended), else show FILE
has() {
  grep -qE -- "$2" "$1" && return 0
  echo "    no line matching /$2/ in:" && sed 's/^/    | /' "$1"
  return 1
}
# results NAME LOG PASSES FAILS RC: adds the counts of a test program's run (PASSES and FAILS,
# read from its output LOG) to the suite's; a run without results, or that failed without a
# failed test, is a failure. LOG (and LOG.err) are shown when something failed.
results() {
  if [[ -z $3 || -z $4 ]] || (($3 == 0)); then
    cat "$2" "$2.err" 2>/dev/null | sed 's/^/    | /'
    not_ok "$1: the test run produced no results (exit $5)"
    return
  fi
  passed=$((passed + $3))
  failed=$((failed + $4))
  (($4 > 0)) && sed 's/^/    | /' "$2"
  (($5 != 0 && $4 == 0)) && not_ok "$1: the test run exited $5"
}
q() { psql -X -At -v ON_ERROR_STOP=1 "$@"; }

PGPORT_EX="$(idem_free_port 5480 5489)" || idem_die "no free port in 5480-5489"
# The test servers' search_path names the extension's schema (test/lib.sh); users' servers
# do not: nor does this one. Like Debian's, it listens on localhost, where app logs in with
# its password (the page's PGPASSWORD); the suite itself uses the unix socket.
cluster_start "$IDEM_SCRATCH/pg" "$PGPORT_EX" "search_path = '\"\$user\", public'" \
  "listen_addresses = 'localhost'" "password_encryption = 'scram-sha-256'"
printf '%s\n' "local all all trust" "host all all 127.0.0.1/32 scram-sha-256" "host all all ::1/128 scram-sha-256" |
  as_pg tee "$IDEM_SCRATCH/pg/data/pg_hba.conf" >/dev/null
as_pg pg_ctl -D "$IDEM_SCRATCH/pg/data" reload >/dev/null
for db in py; do q -c "CREATE DATABASE $db" postgres >/dev/null; done
# app as the README's "Creating the extension" makes it.
q -c "CREATE ROLE py_app LOGIN" -c "CREATE ROLE app LOGIN PASSWORD 'app'" postgres >/dev/null
OUT="$IDEM_SCRATCH/out"
mkdir -p "$OUT"

# --- examples/README.md, as printed -------------------------------------------------------
DOC="$EX/README.md"
MDB=(/usr/bin/python3 "$IDEM_ROOT/test/docs/mdblocks.py")
# A fresh database app, owned by the role app, as the README's "Creating the extension" says.
fresh_app() {
  q -c "DROP DATABASE IF EXISTS app WITH (FORCE)" -c "CREATE DATABASE app OWNER app" postgres >/dev/null &&
    q -d app -c "CREATE EXTENSION idempotency" -c "GRANT USAGE ON SCHEMA idempotency TO app" >/dev/null
}
# The page's connection, set once: its export line with this server's port for 5432.
ENV_LINE="$("${MDB[@]}" command "$DOC" "export PGHOST")" || idem_die "no export line in $DOC"
ENV_LINE="${ENV_LINE/PGPORT=5432/PGPORT=$PGPORT_EX}"
# in_page_env CMD: runs the shell text CMD from the top directory as a user of the page does:
# in a shell where the page's export line ran (none of the suite's PG* settings), with
# Debian's python3, node and go first on PATH.
in_page_env() {
  (cd "$IDEM_ROOT" && env -u PGHOST -u PGPORT -u PGUSER -u PGDATABASE -u PGPASSWORD \
    PATH="/usr/bin:$PATH" bash -c "$ENV_LINE; $1")
}
# documented NAME TEXT LOG [SED]: runs the command of examples/README.md's sh block holding
# TEXT on a fresh database app; stdout to LOG, stderr to LOG.err. SED edits the command.
documented() {
  local cmd
  cmd="$("${MDB[@]}" command "$DOC" "$2")" || return 1
  [[ -n ${4:-} ]] && cmd="$(sed -e "$4" <<<"$cmd")"
  echo "# \$ $cmd"
  fresh_app || return 1
  in_page_env "$cmd" >"$3" 2>"$3.err"
}
# shows_output NAME TEXT LOG [SED]: LOG is the output block after that sh block, exactly
# (after SED, which makes the same substitutions as the command's).
shows_output() {
  if diff -u <("${MDB[@]}" output "$DOC" "$2" | sed -e "${4:-}") "$3" >"$3.diff"; then
    ok "$1"
  else
    sed 's/^/    | /' "$3.diff" "$3.err"
    not_ok "$1"
  fi
}
# The tables of each example are its own, and every key belongs to app.
keys_of_app() { # NAME: every key in app belongs to the role app, and there are some
  check "$1: every key belongs to app" \
    test "$(q -d app -c "SELECT count(*) > 0 AND bool_and(owner::text = 'app') FROM idempotency.idempotency_keys")" = t
}
echo "# examples/README.md: $ENV_LINE (password authentication over TCP)"

# as_printed NAME TEXT TABLES: the sh block holding TEXT runs as printed on a fresh database
# app, exits 0 and prints its output block; every key is app's; the tables it made are TABLES.
as_printed() {
  local log="$OUT/doc-$1.log"
  echo "# examples/README.md: $1"
  documented "$1" "$2" "$log"
  check "README $1 command exits 0" test $? -eq 0
  shows_output "README $1 command prints what examples/README.md shows" "$2" "$log"
  keys_of_app "README $1"
  check "README $1: its tables are $3" \
    test "$(q -d app -c "SELECT string_agg(tablename, ',' ORDER BY tablename) FROM pg_tables WHERE schemaname = 'public'")" = "$3"
}
as_printed python "consumer.py --setup" "accounts,ledger"
as_printed batch "batch_consumer.py --setup" "batch_accounts,batch_ledger"
as_printed go "go run inbox.go" "go_accounts"
echo "# the two consumers in one database, as a user runs them: each applies every message once"
in_page_env "python3 examples/python/consumer.py --setup examples/python/messages.jsonl" >"$OUT/both.log" 2>&1 &&
  in_page_env "python3 examples/python/batch_consumer.py --setup examples/python/messages.jsonl" >>"$OUT/both.log" 2>&1
check "consumer.py then batch_consumer.py in one database: both exit 0, nothing applied twice" \
  has "$OUT/both.log" '^\[batch-consumer\] messages applied more than once: 0$'

echo "# examples/README.md: psql, twice (it must be re-runnable)"
fresh_app
walk_cmd="$("${MDB[@]}" command "$DOC" "walkthrough.sql")"
for i in 1 2; do
  in_page_env "$walk_cmd" >"$OUT/walk$i.out" 2>"$OUT/walk$i.err"
  rc=$?
  if ((rc == 0)) && diff -u "$EX/sql/walkthrough.out" "$OUT/walk$i.out" >"$OUT/walk$i.diff"; then
    ok "README sql walkthrough, run $i, prints walkthrough.out"
  else
    sed 's/^/    | /' "$OUT/walk$i.diff" "$OUT/walk$i.err"
    not_ok "README sql walkthrough, run $i (exit $rc)"
  fi
done
# Its only error is the fenced complete_key it shows on purpose.
check "sql walkthrough: the one expected error (stale token) and nothing else" \
  test "$(grep -c 'ERROR' "$OUT/walk2.err")" = 1
keys_of_app "README sql walkthrough"

# --- Python: inbox consumer ------------------------------------------------------------
echo "# python: one consumer, every message delivered two or three times, one crash"
DSN="host=$PGHOST port=$PGPORT user=py_app dbname=py"
"$PY" "$EX/python/consumer.py" --dsn "$DSN" --setup --setup-dsn "host=$PGHOST port=$PGPORT user=postgres dbname=py" \
  --name one --crash-once pay-2 "$EX/python/messages.jsonl" >"$OUT/py1.log" 2>&1
check "python consumer exits 0" test $? -eq 0
check "python: the consumer ran as py_app, not a superuser, with USAGE on schema idempotency" \
  test "$(q -d py -c "SELECT rolsuper, has_schema_privilege('py_app', 'idempotency', 'USAGE')
                        FROM pg_roles WHERE rolname = 'py_app'")" = "f|t"
check "python: first delivery of pay-1 applied" has "$OUT/py1.log" $'^\\[one\\] pay-1\tclaimed applied balance=100$'
check "python: crash after the write rolled back, redelivery applied once" \
  bash -c "grep -qE $'pay-2\tcrashed' '$OUT/py1.log' && grep -qE $'pay-2\tclaimed applied balance=250\$' '$OUT/py1.log'"
check "python: duplicates are replays (3 of 7 deliveries)" \
  test "$(grep -cE $'\treplay skipped' "$OUT/py1.log")" -eq 3
check "python: same id with another payload is dead-lettered" has "$OUT/py1.log" $'pay-3\tmismatch'
check "python: ledger holds each message once" \
  test "$(q -d py -c "SELECT string_agg(message_id || ':' || n, ',' ORDER BY message_id)
                        FROM (SELECT message_id, count(*) n FROM ledger GROUP BY 1) s")" = "pay-1:1,pay-2:1,pay-3:1"
check "python: final balances" has "$OUT/py1.log" '^\[one\] balances \{"alice": 140, "bob": 250\}$'

echo "# python: two consumers get the same message; A is still inside its transaction"
q -d py -c "TRUNCATE ledger, accounts" >/dev/null
printf '%s\n' '{"id": "race-1", "account": "carol", "amount": 30}' >"$OUT/race.jsonl"
"$PY" "$EX/python/consumer.py" --dsn "$DSN application_name=consumerA" --name A --work-delay 3 \
  "$OUT/race.jsonl" >"$OUT/pyA.log" 2>&1 &
pid_a=$!
IDEM_BG_PIDS+=("$pid_a")
# Wait until A has claimed and sits in its open transaction (the claim is uncommitted).
for _ in $(seq 100); do
  [[ $(q -d py -c "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'consumerA'
                     AND state = 'idle in transaction' AND xact_start IS NOT NULL") == 1 ]] && break
  sleep 0.05
done
"$PY" "$EX/python/consumer.py" --dsn "$DSN" --name B --max-retry-sleep 1 "$OUT/race.jsonl" >"$OUT/pyB.log" 2>&1
rc_b=$?
wait "$pid_a"
rc_a=$?
check "python race: both consumers exit 0" test "$rc_a$rc_b" = 00
check "python race: A applied the effect" has "$OUT/pyA.log" $'race-1\tclaimed applied balance=30$'
check "python race: B was told in_progress while A was running" has "$OUT/pyB.log" $'race-1\tin_progress \\(attempt 1\\)'
check "python race: B then got the replay" has "$OUT/pyB.log" $'race-1\treplay skipped \\(first delivery left balance=30\\)$'
check "python race: one ledger row" test "$(q -d py -c "SELECT count(*) FROM ledger WHERE message_id = 'race-1'")" = 1
check "python: every key belongs to the consumer's role" \
  test "$(q -d py -c "SELECT count(*) > 0 AND bool_and(owner = 'py_app') FROM idempotency.idempotency_keys")" = t
cat "$OUT/py1.log" "$OUT/pyA.log" "$OUT/pyB.log" | sed 's/^/    /'

# --- Node.js: HTTP endpoint, as examples/README.md runs it -----------------------------
echo "# node $(node --version): the README's npm ci && ... npm test (real HTTP requests)"
http_port="$(idem_free_port $((PGPORT_EX + 1)) 5489)" || idem_die "no free HTTP port in 5480-5489"
documented node "npm test" "$OUT/node.tap" "s/HTTP_PORT=3001/HTTP_PORT=$http_port/"
rc_node=$?
grep -E '^(not )?ok |^# (pass|fail)' "$OUT/node.tap" | sed 's/^/    /'
results "node: npm ci / npm test" "$OUT/node.tap" "$(sed -n 's/^# pass \([0-9]*\)$/\1/p' "$OUT/node.tap" | tail -1)" \
  "$(sed -n 's/^# fail \([0-9]*\)$/\1/p' "$OUT/node.tap" | tail -1)" "$rc_node"
check "node: each effect once in the database" \
  test "$(q -d app -c "SELECT count(*) FROM (SELECT idempotency_key FROM api_payments
                                             GROUP BY 1 HAVING count(*) > 1) s")" = 0
keys_of_app "node"

echo "# examples/README.md: the server in the background, a duplicate in flight (409), the replay"
# The block as printed, on a free port for 3000. Its second request is sent a second after the
# first; so that the first is still running then whatever the machine's speed, the suite holds
# a lock that the first request's INSERT INTO api_payments waits for, and lets go once the
# 409 is out (either request may be the one that waits: the output is the same).
fresh_app
demo409="$("${MDB[@]}" block "$DOC" "EXAMPLE_EFFECT_DELAY_MS")"
port409="$(idem_free_port $((PGPORT_EX + 1)) 5489)" || idem_die "no free HTTP port in 5480-5489"
sub409="s/PORT=3000/PORT=$port409/; s/localhost:3000/localhost:$port409/g; s/127.0.0.1:3000/127.0.0.1:$port409/"
q -d app -c "CREATE TABLE IF NOT EXISTS api_payments (id bigserial PRIMARY KEY, account text NOT NULL,
               amount bigint NOT NULL, idempotency_key text NOT NULL, at timestamptz NOT NULL DEFAULT now())" \
  -c "ALTER TABLE api_payments OWNER TO app" >/dev/null
mkfifo "$OUT/lock.fifo"
psql -X -q -d app <"$OUT/lock.fifo" >"$OUT/lock.log" 2>&1 &
IDEM_BG_PIDS+=("$!")
exec 7>"$OUT/lock.fifo"
echo "BEGIN; LOCK TABLE api_payments IN SHARE MODE;" >&7
for _ in $(seq 200); do
  [[ $(q -d app -c "SELECT count(*) FROM pg_locks WHERE relation = 'api_payments'::regclass
                      AND mode = 'ShareLock' AND granted") == 1 ]] && break
  sleep 0.05
done
: >"$OUT/409.log"
in_page_env "$(sed -e "$sub409" <<<"$demo409")" >"$OUT/409.log" 2>"$OUT/409.err" &
pid409=$!
IDEM_BG_PIDS+=("$pid409")
for _ in $(seq 600); do grep -q '^HTTP/1.1 409' "$OUT/409.log" && break; sleep 0.1; done
echo "COMMIT;" >&7
exec 7>&-
wait "$pid409"
check "README 409 block exits 0" test $? -eq 0
shows_output "README 409 block prints what examples/README.md shows (409 in flight, then the same bytes replayed)" \
  "EXAMPLE_EFFECT_DELAY_MS" "$OUT/409.log" "$sub409"
keys_of_app "README 409 block"

# --- demo/demo.sql without PGDATABASE ----------------------------------------------------
echo "# demo: psql -d demo -f demo/demo.sql, PGDATABASE unset (its second session must find the demo database)"
q -c "CREATE DATABASE demo" postgres >/dev/null && q -d demo -c "CREATE EXTENSION idempotency" >/dev/null
(unset PGDATABASE && psql -X -d demo -f "$IDEM_ROOT/demo/demo.sql") >"$OUT/demo.log" 2>&1
check "demo.sql exits 0" test $? -eq 0
check "demo.sql: no statement failed (the second session too)" bash -c "! grep -E 'ERROR|FATAL' '$OUT/demo.log'"
check "demo.sql: session B saw in_progress while A's transaction was open" \
  grep -qE '^\| M2 +\| in_progress +\| +409 ' "$OUT/demo.log"
check "demo.sql: charged exactly once" grep -qE '^\| +20\.00 \| +20\.00 \| t ' "$OUT/demo.log"

# --- Go: the net/http middleware (examples/go/middleware) ---------------------------------
# Any handler behind Idempotency-Key: its tests serve the receipts service and test handlers
# on 127.0.0.1 and send real requests (a replay is the first response byte for byte: status,
# body, headers), then the service itself runs as a user starts it and is asked twice.
echo "# go: examples/go/middleware (go test: real HTTP requests on 127.0.0.1)"
fresh_app
# The example imports the package (clients/go), built offline as clients/go/offline.sh builds
# it: GOPATH mode, pgx from Debian's packages.
go_mw() { (cd "$EX/go/middleware" && PATH="/usr/bin:$PATH" PGDATABASE=app PGUSER=app \
  "$IDEM_ROOT/clients/go/offline.sh" "$@"); }
mw_port="$(idem_free_port $((PGPORT_EX + 1)) 5489)" || idem_die "no free HTTP port in 5480-5489"
HTTP_PORT="$mw_port" go_mw go test -v -count=1 . >"$OUT/go-mw.log" 2>&1
rc_mw=$?
grep -E '^--- (PASS|FAIL)' "$OUT/go-mw.log" | sed 's/^/    /'
results "go middleware: go test" "$OUT/go-mw.log" "$(grep -c '^--- PASS' "$OUT/go-mw.log")" \
  "$(grep -c '^--- FAIL' "$OUT/go-mw.log")" "$rc_mw"
check "go middleware: every key belongs to app" \
  test "$(q -d app -c "SELECT count(*) > 0 AND bool_and(owner::text = 'app') FROM idempotency.idempotency_keys")" = t
check "go middleware: the receipts are stored as their ISO-8859-1 bytes (not UTF-8)" \
  test "$(q -d app -c "SELECT count(*) > 0 FROM idempotency.idempotency_keys
                       WHERE position('\\x5265e775206eb020'::bytea IN response_body) = 1")" = t
echo "# go: the receipts service as a user runs it, one POST sent twice with curl"
fresh_app
mw_port="$(idem_free_port $((PGPORT_EX + 1)) 5489)" || idem_die "no free HTTP port in 5480-5489"
go_mw go build -o "$OUT/receipts" . >"$OUT/receipts.log" 2>&1
(cd "$EX/go/middleware" && PGDATABASE=app PGUSER=app exec "$OUT/receipts" "127.0.0.1:$mw_port") >>"$OUT/receipts.log" 2>&1 &
mw_pid=$!
IDEM_BG_PIDS+=("$mw_pid")
for _ in $(seq 300); do grep -q 'listening on' "$OUT/receipts.log" && break; sleep 0.1; done
for i in 1 2; do
  curl -s -D "$OUT/receipt$i.head" -o "$OUT/receipt$i.body" -X POST "http://127.0.0.1:$mw_port/receipts" \
    -H 'Idempotency-Key: receipt-1' -d 'amount=100'
done
kill "$mw_pid" 2>/dev/null
wait "$mw_pid" 2>/dev/null
# The status line and the stored headers of a response, in a fixed order.
head_of() { tr -d '\r' <"$1" | grep -iE '^(HTTP/|content-type|location|link|content-length)' | sort; }
check "go receipts: the first POST is 201 with a Location" \
  grep -qiE '^location: /receipts/[0-9]+' "$OUT/receipt1.head"
check "go receipts: the second is the first byte for byte (body, status, headers)" \
  bash -c 'cmp "$1" "$2" && [[ $3 == "$4" ]]' _ "$OUT/receipt1.body" "$OUT/receipt2.body" \
  "$(head_of "$OUT/receipt1.head")" "$(head_of "$OUT/receipt2.head")"
check "go receipts: only the second is marked Idempotent-Replayed" \
  bash -c "grep -qi '^idempotent-replayed: true' '$OUT/receipt2.head' && ! grep -qi '^idempotent-replayed' '$OUT/receipt1.head'"
check "go receipts: one receipt made" test "$(q -d app -c "SELECT count(*) FROM receipts")" = 1

echo "${passed} passed, ${failed} failed"
((failed == 0))
