#!/usr/bin/env bash
# Suite: message consumers on a real broker (issue #35, the broker half of
# clients/conformance/CONTRACT.md). A throw-away RabbitMQ (Debian's rabbitmq-server, on
# 127.0.0.1, every file in the scratch directory, its own Erlang distribution port and its own
# epmd: test/broker/rabbitmq.sh) and a throw-away PostgreSQL on 127.0.0.1; for each package's
# consumer program test/broker/harness.py (pika) declares a queue with a dead-letter queue,
# publishes messages with duplicates and mismatches (the same message_id, another body), runs
# two consumers at once with manual acks in single, batch and two_phase modes, kills them
# (CRASH_AFTER_COMMIT: SIGKILL between COMMIT and ack; SIGKILL from outside mid-batch),
# restarts PostgreSQL once (immediate stop: a crash), and counts: 0 double effects, 0 lost
# messages, every mismatch in the dead-letter queue. The consumers:
#   go       clients/go/cmd/conformance-consumer, built offline (clients/go/offline.sh)
#   python   clients/python/conformance_consumer.py      (Debian's python3-pika)
#   node     clients/node/conformance-consumer.js, after npm ci (amqplib)
# A package whose directory is absent is skipped (said so); one present without its consumer
# fails. One line per language, "broker-LANG: N passed, M failed"; ends with "N passed, N failed".
#   BROKER_CLIENTS=DIR, BROKER_GO_DIR, BROKER_PYTHON_DIR, BROKER_NODE_DIR   where the packages are
#   BROKER_ONLY="go node"    only these languages
#   BROKER_MESSAGES=N        messages per mode (default 300: about 2,500 deliveries per language)
#   BROKER_SEED=N            the harness's seed (printed)
# bench/broker_soak.sh is the long run of the same harness.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/../broker/rabbitmq.sh"
command -v node >/dev/null || IDEM_PACKAGES+=(nodejs)
command -v npm >/dev/null || IDEM_PACKAGES+=(npm)
IDEM_PACKAGES+=(rabbitmq-server python3-pika python3-psycopg golang-go golang-github-jackc-pgx-v4-dev
  golang-github-rabbitmq-amqp091-go-dev)
ensure_packages
build_and_install
idem_scratch_init
# Stop the broker whatever happens (test/lib.sh's EXIT trap stops the servers and the rest).
# shellcheck disable=SC2154  # broker_rc is assigned by the trap itself
trap 'broker_rc=$?; rabbit_stop; (exit $broker_rc); idem_on_exit' EXIT

PY=/usr/bin/python3
CLIENTS="${BROKER_CLIENTS:-$IDEM_ROOT/clients}"
GO_DIR="${BROKER_GO_DIR:-$CLIENTS/go}"
PY_DIR="${BROKER_PYTHON_DIR:-$CLIENTS/python}"
NODE_DIR="${BROKER_NODE_DIR:-$CLIENTS/node}"
SEED="${BROKER_SEED:-20261205}"
MESSAGES="${BROKER_MESSAGES:-300}"
HARNESS=("$PY" "$IDEM_ROOT/test/broker/harness.py")
OUT="$IDEM_SCRATCH/broker"
mkdir -p "$OUT"
chmod 755 "$OUT"
PASSED=0 FAILED=0
not_ok() { echo "not ok - $1"; FAILED=$((FAILED + 1)); }
wanted_lang() {
  [[ -z ${BROKER_ONLY:-} ]] && return 0
  local w
  for w in $BROKER_ONLY; do [[ $1 == "$w" ]] && return 0; done
  return 1
}

# PostgreSQL: TCP on 127.0.0.1; a search_path without the extension's schema (as users have it).
PGPORT_B="$(idem_free_port 5510 5513)" || idem_die "no free port in 5510-5513"
cluster_start "$IDEM_SCRATCH/pg" "$PGPORT_B" "listen_addresses = '127.0.0.1'" \
  "search_path = '\"\$user\", public'" "max_connections = 200" || idem_die "could not start a server"
PGDIR="$IDEM_SCRATCH/pg"
q() { psql -X -qAt -v ON_ERROR_STOP=1 "$@"; }
q -d postgres -c "CREATE ROLE app LOGIN" >/dev/null
# The restart the harness makes once per language: an immediate stop (a crash), then start.
PG_RESTART="runuser -u postgres -- env PATH='$PATH' pg_ctl -D '$PGDIR/data' -l '$PGDIR/server.log' -m immediate -w -t 60 restart >/dev/null"
idem_is_root || PG_RESTART="pg_ctl -D '$PGDIR/data' -l '$PGDIR/server.log' -m immediate -w -t 60 restart >/dev/null"

# RabbitMQ: AMQP on a free port p of 5514-5515 whose p+1 (distribution), p+2 (epmd), p+3 and
# p+4 (rabbitmqctl's distribution) are free.
# An epmd of this suite left by a run killed with -9 (no node registered with it any more)
# would hold the range: stopped.
for p in 5516 5517; do
  names="$(epmd -port "$p" -names 2>/dev/null)" || continue
  grep -q '^epmd: up and running' <<<"$names" && ! grep -q '^name ' <<<"$names" &&
    epmd -port "$p" -kill >/dev/null 2>&1
done
AMQP_PORT=""
for p in 5514 5515; do
  idem_free_port "$p" "$p" >/dev/null && idem_free_port $((p + 1)) $((p + 1)) >/dev/null &&
    idem_free_port $((p + 2)) $((p + 2)) >/dev/null && idem_free_port $((p + 3)) $((p + 4)) >/dev/null &&
    AMQP_PORT=$p && break
done
[[ -n $AMQP_PORT ]] || idem_die "no free ports in 5514-5519 for RabbitMQ"
echo "# rabbitmq-server $(dpkg-query -W -f='${Version}' rabbitmq-server): AMQP on 127.0.0.1:$AMQP_PORT"
if ! rabbit_start "$IDEM_SCRATCH/rabbitmq" "$AMQP_PORT"; then
  not_ok "RabbitMQ did not start (its log: $IDEM_SCRATCH/rabbitmq/log)"
  echo "${PASSED} passed, ${FAILED} failed"
  exit 1
fi
AMQP_URL="amqp://guest:guest@127.0.0.1:$AMQP_PORT/"

# fresh_db NAME: a new database for one language, with the contract's broker_effects table.
fresh_db() {
  q -d postgres -c "SET client_min_messages = warning" -c "DROP DATABASE IF EXISTS $1 WITH (FORCE)" \
    -c "CREATE DATABASE $1" >/dev/null &&
    q -d "$1" >/dev/null <<'SQL'
CREATE EXTENSION idempotency;
GRANT USAGE ON SCHEMA idempotency TO app;
-- No unique constraint on message_id: a double effect must be countable, not refused.
CREATE TABLE broker_effects (id bigserial PRIMARY KEY, message_id text NOT NULL, consumer text NOT NULL,
                             amount int NOT NULL, applied_at timestamptz NOT NULL DEFAULT clock_timestamp());
ALTER TABLE broker_effects OWNER TO app;
SQL
}

# More harness options (bench/broker_soak.sh), split on spaces: --crash-kills 10 ...
read -r -a extra_args <<<"${BROKER_HARNESS_ARGS:-}"
# consume LANG DIR CMD...: the harness against the consumer CMD (run in DIR).
consume() {
  local lang="$1" dir="$2" db="broker_$1" log line p f
  shift 2
  fresh_db "$db" || { not_ok "broker-$lang: could not make its database"; return; }
  log="$OUT/$lang.log"
  (cd "$dir" && "${HARNESS[@]}" --lang "$lang" --amqp-url "$AMQP_URL" --seed "$SEED" --messages "$MESSAGES" \
    --database-url "postgresql://app@127.0.0.1:$PGPORT_B/$db" \
    --admin-url "postgresql://postgres@127.0.0.1:$PGPORT_B/$db" \
    --pg-restart-cmd "$PG_RESTART" --log-dir "$OUT" "${extra_args[@]}" -- "$@") >"$log" 2>&1
  grep -E '^(not ok|#)' "$log" | sed 's/^/    /'
  line="$(grep -E "^broker-$lang: [0-9]+ passed, [0-9]+ failed$" "$log" | tail -1)"
  if [[ -z $line ]]; then
    tail -40 "$log" | sed 's/^/    | /'
    not_ok "broker-$lang: the harness printed no summary (see $log)"
    return
  fi
  echo "$line"
  read -r p _ f _ <<<"${line#*: }"
  PASSED=$((PASSED + p))
  FAILED=$((FAILED + f))
  if ((f > 0)); then
    for l in "$OUT/$lang"-*.log; do
      echo "    --- $l (last 20 lines) ---"
      tail -20 "$l" | sed 's/^/    | /'
    done
  fi
}

langs=0
if wanted_lang go; then
  if [[ ! -d $GO_DIR ]]; then
    echo "# $GO_DIR is absent: no Go package to test"
  elif [[ ! -d $GO_DIR/cmd/conformance-consumer || ! -f $GO_DIR/offline.sh ]]; then
    not_ok "broker-go: $GO_DIR has no cmd/conformance-consumer or no offline.sh"
  else
    langs=$((langs + 1))
    if (cd "$GO_DIR" && PATH="/usr/bin:$PATH" IDEM_GOPATH="$OUT/gopath" \
      sh ./offline.sh go build -o "$OUT/conformance-consumer" ./cmd/conformance-consumer) >"$OUT/go-build.log" 2>&1; then
      consume go "$GO_DIR" "$OUT/conformance-consumer"
    else
      sed 's/^/    | /' "$OUT/go-build.log"
      not_ok "broker-go: cmd/conformance-consumer does not build"
    fi
  fi
fi
if wanted_lang python; then
  if [[ ! -d $PY_DIR ]]; then
    echo "# $PY_DIR is absent: no Python package to test"
  elif [[ ! -f $PY_DIR/conformance_consumer.py ]]; then
    not_ok "broker-python: $PY_DIR has no conformance_consumer.py"
  else
    langs=$((langs + 1))
    consume python "$PY_DIR" "$PY" "$PY_DIR/conformance_consumer.py"
  fi
fi
if wanted_lang node; then
  if [[ ! -d $NODE_DIR ]]; then
    echo "# $NODE_DIR is absent: no Node package to test"
  elif [[ ! -f $NODE_DIR/conformance-consumer.js ]]; then
    not_ok "broker-node: $NODE_DIR has no conformance-consumer.js"
  else
    langs=$((langs + 1))
    # A copy of the package: npm ci writes node_modules, and the tree may be read-only.
    rm -rf "$OUT/node-pkg"
    mkdir -p "$OUT/node-pkg"
    (cd "$NODE_DIR" && tar --exclude=node_modules -cf - .) | (cd "$OUT/node-pkg" && tar -xf -)
    if (cd "$OUT/node-pkg" && npm ci --no-audit --no-fund) >"$OUT/npm-ci.log" 2>&1; then
      consume node "$OUT/node-pkg" node "$OUT/node-pkg/conformance-consumer.js"
    else
      tail -30 "$OUT/npm-ci.log" | sed 's/^/    | /'
      not_ok "broker-node: npm ci failed"
    fi
  fi
fi
# A stand-in consumer (BROKER_EXTRA="NAME DIR CMD...") for trying the harness itself.
if [[ -n ${BROKER_EXTRA:-} ]]; then
  read -r -a extra <<<"$BROKER_EXTRA"
  langs=$((langs + 1))
  consume "${extra[@]}"
fi

((langs > 0)) || not_ok "no consumer program found under $CLIENTS (go, python, node)"
echo "${PASSED} passed, ${FAILED} failed"
((FAILED == 0))
