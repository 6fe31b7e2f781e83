#!/usr/bin/env bash
# Suite: the Go package (clients/go) builds offline from Debian's packages alone and its own
# tests pass against a real server and a real broker.
#   gofmt, go vet        clean
#   go build             the module, cmd/conformance-app and cmd/conformance-consumer
#                        (clients/go/offline.sh: GOPATH mode over /usr/share/gocode)
#   go test -v           key parsing, SQLSTATE answers, fingerprints (no server); the
#                        middleware against a throw-away server as a role with USAGE only, on a
#                        server whose search_path does not name the extension's schema; the
#                        consumer helpers with a recording acknowledger, and Consumer.Run on a
#                        throw-away RabbitMQ (loopback, its own data directory). Every PASS and
#                        FAIL line (subtests too) counts; a SKIP here is a failure.
#   without a server     the server tests skip and say why
# Ends with "N passed, N failed".
set -uo pipefail
source "$(dirname "$0")/../lib.sh"
IDEM_PACKAGES+=(golang-go golang-github-jackc-pgx-v4-dev golang-github-rabbitmq-amqp091-go-dev rabbitmq-server)
ensure_packages
build_and_install
idem_scratch_init

GO_DIR="$IDEM_ROOT/clients/go"
OUT="$IDEM_SCRATCH/client_go"
mkdir -p "$OUT"
chmod 755 "$OUT"
export IDEM_GOPATH="$OUT/gopath"
passed=0 failed=0
ok() { echo "ok - $1"; passed=$((passed + 1)); }
not_ok() { echo "not ok - $1"; failed=$((failed + 1)); }
# gorun LOG CMD...: CMD in clients/go offline (Debian's go first on PATH); output to LOG.
gorun() {
  local log="$1"
  shift
  (cd "$GO_DIR" && PATH="/usr/bin:$PATH" ./offline.sh "$@") >"$log" 2>&1
}
show() { sed 's/^/    | /' "$1" | tail -40; }

echo "# $(PATH="/usr/bin:$PATH" go version)"
unformatted="$(cd "$GO_DIR" && PATH="/usr/bin:$PATH" gofmt -l .)"
if [[ -z $unformatted ]]; then ok "gofmt -l: clean"; else not_ok "gofmt -l: $unformatted"; fi
if gorun "$OUT/vet.log" go vet ./...; then ok "go vet ./...: clean"; else show "$OUT/vet.log"; not_ok "go vet ./..."; fi
for cmd in conformance-app conformance-consumer; do
  if gorun "$OUT/build-$cmd.log" go build -o "$OUT/$cmd" "./cmd/$cmd"; then
    ok "go build ./cmd/$cmd (offline, Debian's packages)"
  else
    show "$OUT/build-$cmd.log"
    not_ok "go build ./cmd/$cmd"
  fi
done

# The README's Go blocks are excerpts of example_test.go, which go vet and go test compile.
readme_lines="$(awk '/^```go$/ {on = 1; next} /^```$/ {on = 0} on' "$GO_DIR/README.md")"
missing="$(while IFS= read -r line; do
  grep -qF -- "$(sed 's/^[[:space:]]*//' <<<"$line")" "$GO_DIR/example_test.go" || echo "$line"
done <<<"$readme_lines")"
if [[ -n $readme_lines && -z $missing ]]; then
  ok "README.md: its Go blocks are excerpts of example_test.go (compiled)"
else
  not_ok "README.md: lines not in example_test.go: $missing"
fi

# Without a server, the server tests skip and say why (a user's `go test` on a laptop).
gorun "$OUT/noserver.log" env -u PGHOST -u PGPORT -u PGUSER -u PGDATABASE PGHOST="$OUT/nowhere" PGPORT=1 \
  go test -count=1 -v -run 'TestServerReplayByteForByte|TestParseKey' .
if grep -q -- '--- PASS: TestParseKey' "$OUT/noserver.log" &&
  grep -q -- '--- SKIP: TestServerReplayByteForByte' "$OUT/noserver.log" &&
  grep -q 'no PostgreSQL server from the PG\* environment' "$OUT/noserver.log"; then
  ok "go test without a server: the server tests skip with the reason"
else
  show "$OUT/noserver.log"
  not_ok "go test without a server"
fi

# The server: users' search_path (not naming the schema); the tests run as a role with USAGE.
PGPORT_GO="$(idem_free_port 5570 5579)" || idem_die "no free port in 5570-5579"
cluster_start "$IDEM_SCRATCH/pg" "$PGPORT_GO" "search_path = '\"\$user\", public'" "max_connections = 100" ||
  idem_die "could not start a server"
psql -X -q -v ON_ERROR_STOP=1 -d postgres >/dev/null <<'SQL' || idem_die "set-up failed"
CREATE ROLE go_app LOGIN;
CREATE DATABASE go_client OWNER go_app;
\c go_client
CREATE EXTENSION idempotency;
GRANT USAGE ON SCHEMA idempotency TO go_app;
SQL

# The broker: a throw-away RabbitMQ on loopback, every file in its own directory, its Erlang
# distribution and its own epmd on the next two ports (never the shared epmd on 4369), stopped
# with its epmd when the suite ends.
AMQP_URL="" GO_RABBIT_PORT=""
go_rabbit_env() {
  local dir="$OUT/rabbitmq" port="$GO_RABBIT_PORT"
  env HOME="$dir" RABBITMQ_NODENAME="idemgo$port@localhost" RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
    RABBITMQ_NODE_PORT="$port" RABBITMQ_DIST_PORT="$((port + 1))" ERL_EPMD_PORT="$((port + 2))" \
    ERL_EPMD_ADDRESS=127.0.0.1 RABBITMQ_MNESIA_BASE="$dir/mnesia" RABBITMQ_LOG_BASE="$dir/log" \
    RABBITMQ_CONFIG_FILE="$dir/rabbitmq" RABBITMQ_ADVANCED_CONFIG_FILE="$dir/advanced.config" \
    RABBITMQ_CONF_ENV_FILE="$dir/rabbitmq-env.conf" RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins" \
    RABBITMQ_PID_FILE="$dir/rabbit.pid" \
    RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}" "$@"
}
go_rabbit_stop() {
  [[ -n $GO_RABBIT_PORT ]] || return 0
  go_rabbit_env timeout 60 /usr/lib/rabbitmq/bin/rabbitmqctl -q stop "$OUT/rabbitmq/rabbit.pid" >/dev/null 2>&1 ||
    kill -KILL "$(cat "$OUT/rabbitmq/rabbit.pid" 2>/dev/null)" 2>/dev/null
  go_rabbit_env epmd -kill >/dev/null 2>&1
  GO_RABBIT_PORT=""
}
start_rabbitmq() {
  local dir="$OUT/rabbitmq" p
  for ((p = 5690; p <= 5697; p++)); do
    [[ $(idem_free_port "$p" "$p") == "$p" && $(idem_free_port $((p + 1)) $((p + 1))) == $((p + 1)) &&
      $(idem_free_port $((p + 2)) $((p + 2))) == $((p + 2)) ]] && break
  done
  ((p <= 5697)) || return 1
  GO_RABBIT_PORT="$p"
  trap 'rc=$?; go_rabbit_stop; (exit $rc); idem_on_exit' EXIT
  mkdir -p "$dir/log" "$dir/mnesia"
  head -c 20 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/.erlang.cookie"
  chmod 400 "$dir/.erlang.cookie"
  : >"$dir/rabbitmq-env.conf"
  echo '[].' >"$dir/enabled_plugins"
  echo '[].' >"$dir/advanced.config"
  printf '%s\n' "listeners.tcp.1 = 127.0.0.1:$p" "loopback_users.guest = true" "log.console = false" \
    "disk_free_limit.absolute = 50MB" >"$dir/rabbitmq.conf"
  (cd "$dir" && go_rabbit_env setsid /usr/lib/rabbitmq/bin/rabbitmq-server >"$dir/log/startup.log" 2>&1 &)
  # Until it serves AMQP: a bounded wait, a failure when it does not (not a verdict on speed).
  if ! go_rabbit_env timeout 120 /usr/lib/rabbitmq/bin/rabbitmqctl -q wait --timeout 110 "$dir/rabbit.pid" \
    >"$dir/log/wait.log" 2>&1; then
    tail -20 "$dir/log/startup.log" "$dir/log/wait.log"
    return 1
  fi
  AMQP_URL="amqp://guest:guest@127.0.0.1:$p/"
}
if [[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ]] && start_rabbitmq; then
  echo "# RabbitMQ on $AMQP_URL"
else
  not_ok "a throw-away RabbitMQ did not start (the broker test will skip)"
fi

echo "# go test -v ./... as go_app on port $PGPORT_GO"
gorun "$OUT/test.log" env PGUSER=go_app PGDATABASE=go_client IDEM_TEST_AMQP_URL="$AMQP_URL" \
  go test -count=1 -v ./...
rc=$?
grep -E '^ *--- (PASS|FAIL|SKIP)' "$OUT/test.log" | sed 's/^/    /'
p="$(grep -cE '^ *--- PASS' "$OUT/test.log")"
f="$(grep -cE '^ *--- FAIL' "$OUT/test.log")"
s="$(grep -cE '^ *--- SKIP' "$OUT/test.log")"
passed=$((passed + p))
failed=$((failed + f + s))
((s > 0)) && echo "not ok - $s test(s) skipped although a server and a broker were provided"
((f > 0)) && show "$OUT/test.log"
if ((p == 0)); then
  show "$OUT/test.log"
  not_ok "go test produced no results (exit $rc)"
elif ((rc != 0 && f == 0)); then
  show "$OUT/test.log"
  not_ok "go test exited $rc"
fi
echo "client-go: go test $p passed, $f failed, $s skipped"
echo "${passed} passed, ${failed} failed"
((failed == 0))
