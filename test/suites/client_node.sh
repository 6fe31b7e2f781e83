#!/usr/bin/env bash
# Suite: the Node.js package clients/node (pg-idempotency): npm ci from its committed
# package-lock.json (in a copy: the tree may be read-only), its types checked (tsc --noEmit over
# index.d.ts and a typed use of it), and its node --test tests against a throw-away server:
#   test/key.test.js        Idempotency-Key parsing (no server)
#   test/express.test.js    the Express middleware, real HTTP requests on 127.0.0.1: replays byte
#                           for byte, 409 / 422 / 400, waiting, concurrency, errors not stored,
#                           two-phase, scopes, SQLSTATEs, the policy document
#   test/consumer.test.js   the consumer helpers (single, batch, two-phase) on a recording
#                           channel: acks, requeues, dead-letters, stop()
# The tests run as an ordinary role (node_test_app, USAGE on schema idempotency), on a server
# whose search_path does not name the extension's schema. A skipped test is a failure here.
#   README.md's HTTP quick start, as printed (on a free port for 3000): one POST twice with curl
# The conformance app and consumer run in suites conformance and broker.
# Ends with "N passed, N failed" (node --test's counts, plus the type check).
set -uo pipefail
source "$(dirname "$0")/../lib.sh"
# node and npm may come from elsewhere (nodesource); install Debian's only when absent.
command -v node >/dev/null || IDEM_PACKAGES+=(nodejs)
command -v npm >/dev/null || IDEM_PACKAGES+=(npm)
ensure_packages
build_and_install
idem_scratch_init

passed=0 failed=0
ok() { echo "ok - $1"; passed=$((passed + 1)); }
not_ok() { echo "not ok - $1"; failed=$((failed + 1)); }
OUT="$IDEM_SCRATCH/client_node"
mkdir -p "$OUT"

PORT="$(idem_free_port 5520 5529)" || idem_die "no free port in 5520-5529"
cluster_start "$IDEM_SCRATCH/pg" "$PORT" "search_path = '\"\$user\", public'" "max_connections = 100" ||
  idem_die "could not start a server"
psql -X -q -v ON_ERROR_STOP=1 -c "CREATE DATABASE node_client" postgres || idem_die "createdb failed"
export PGDATABASE=node_client

echo "# node $(node --version), npm $(npm --version): npm ci in a copy of clients/node"
PKG="$OUT/pkg"
mkdir -p "$PKG"
(cd "$IDEM_ROOT/clients/node" && tar --exclude=node_modules -cf - .) | (cd "$PKG" && tar -xf -)
if (cd "$PKG" && npm ci --no-audit --no-fund) >"$OUT/npm-ci.log" 2>&1; then
  ok "npm ci installs from the committed package-lock.json"
else
  sed 's/^/    | /' "$OUT/npm-ci.log" | tail -30
  not_ok "npm ci failed"
  echo "${passed} passed, ${failed} failed"
  exit 1
fi

if (cd "$PKG" && npx --no-install tsc -p tsconfig.json) >"$OUT/tsc.log" 2>&1; then
  ok "types: tsc --noEmit (index.d.ts, test/types-check.ts, // @ts-check sources) is clean"
else
  sed 's/^/    | /' "$OUT/tsc.log" | tail -40
  not_ok "types: tsc --noEmit reports errors"
fi

echo "# node --test (PGHOST=$PGHOST PGPORT=$PGPORT PGDATABASE=$PGDATABASE)"
(cd "$PKG" && node --test --test-reporter=tap test/*.test.js) >"$OUT/tests.tap" 2>"$OUT/tests.err"
rc=$?
grep -E '^(not )?ok |^# (tests|pass|fail|skipped|cancelled)' "$OUT/tests.tap" | sed 's/^/    /'
count() { sed -n "s/^# $1 \([0-9]*\)\$/\1/p" "$OUT/tests.tap" | tail -1; }
p="$(count pass)" f="$(count fail)" s="$(count skipped)" c="$(count cancelled)"
if [[ -z $p || -z $f ]] || ((p == 0)); then
  sed 's/^/    | /' "$OUT/tests.tap" "$OUT/tests.err" | tail -60
  not_ok "node --test produced no results (exit $rc)"
else
  passed=$((passed + p))
  failed=$((failed + f + ${c:-0}))
  ((f > 0 || ${c:-0} > 0)) && sed 's/^/    | /' "$OUT/tests.tap" "$OUT/tests.err" | grep -v '^    |     at ' | tail -80
  # The database tests must have run: a skip means they found no server.
  if ((${s:-0} > 0)); then not_ok "node --test skipped ${s} tests (no server reached?)"; fi
  ((rc != 0 && f == 0)) && not_ok "node --test exited $rc"
fi

# --- README.md's HTTP quick start, as printed ------------------------------------------------
echo "# clients/node/README.md: the HTTP quick start, as the role app, asked twice with curl"
psql -X -q -v ON_ERROR_STOP=1 -c "CREATE ROLE node_qs_app LOGIN" -c "GRANT USAGE ON SCHEMA idempotency TO node_qs_app" \
  -c "CREATE TABLE orders (id serial PRIMARY KEY, item text NOT NULL)" -c "ALTER TABLE orders OWNER TO node_qs_app" ||
  not_ok "quick start: set-up failed"
QS="$OUT/quickstart"
mkdir -p "$QS/node_modules"
ln -s "$PKG" "$QS/node_modules/pg-idempotency" # as npm install ./clients/node makes it
# The js block after the <!-- quickstart.js marker, with a free port for 3000.
qs_port="$(idem_free_port 5525 5529)" || idem_die "no free port in 5525-5529"
awk '/^<!-- quickstart.js/ {m = 1; next} m && /^```js/ {b = 1; next} b && /^```/ {exit} b' \
  "$IDEM_ROOT/clients/node/README.md" | sed "s/app.listen(3000)/app.listen($qs_port, '127.0.0.1')/" >"$QS/quickstart.js"
if ! grep -q "app.listen($qs_port" "$QS/quickstart.js"; then
  not_ok "quick start: no js block with app.listen(3000) after the quickstart.js marker"
else
  (cd "$QS" && PGUSER=node_qs_app NODE_PATH="$PKG/node_modules" exec node quickstart.js) >"$QS/server.log" 2>&1 &
  qs_pid=$!
  IDEM_BG_PIDS+=("$qs_pid")
  for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$qs_port") 2>/dev/null && break; sleep 0.1; done
  for i in 1 2; do
    curl -s -D "$QS/head$i" -o "$QS/body$i" "http://127.0.0.1:$qs_port/orders" -H 'Idempotency-Key: o-1' \
      -H 'Content-Type: application/json' -d '{"item": "book"}'
  done
  if grep -q '^HTTP/1.1 201' "$QS/head1" && cmp -s "$QS/body1" "$QS/body2" && grep -q '^HTTP/1.1 201' "$QS/head2" &&
    grep -qi '^idempotent-replayed: true' "$QS/head2" && ! grep -qi '^idempotent-replayed' "$QS/head1"; then
    ok "quick start: 201, then the same bytes replayed with Idempotent-Replayed: true ($(cat "$QS/body1"))"
  else
    sed 's/^/    | /' "$QS/head1" "$QS/body1" "$QS/head2" "$QS/body2" "$QS/server.log"
    not_ok "quick start: the second POST is not the first's replay"
  fi
  n="$(psql -X -At -c "SELECT count(*) FROM orders")"
  if [[ $n == 1 ]]; then ok "quick start: one order"; else not_ok "quick start: $n orders, not 1"; fi
  kill "$qs_pid" 2>/dev/null
fi

echo "${passed} passed, ${failed} failed"
((failed == 0))
