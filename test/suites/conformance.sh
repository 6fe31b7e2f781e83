#!/usr/bin/env bash
# Suite: the HTTP packages of clients/ conform to clients/conformance/CONTRACT.md (issue #34).
# A throw-away server on 127.0.0.1; for each package's conformance app a fresh database with
# the contract's set-up (the extension, USAGE for the role app, the table payments owned by
# app), and clients/conformance/conformance.py run against it: the script starts the app,
# sends every case (inbox, two_phase, IDEM_STORE_ERRORS=1, IDEM_WAIT_MS), kills it with
# SIGKILL mid-request and restarts it, and counts the rows. The apps:
#   go                 clients/go/cmd/conformance-app, built offline with Debian's Go and pgx v4
#   python-flask       clients/python/conformance_app.py flask      (Debian's python3-flask)
#   python-fastapi     clients/python/conformance_app.py fastapi    (python3-fastapi, uvicorn)
#   python-django      clients/python/conformance_app.py django     (python3-django)
#   node               clients/node/conformance-app.js, after npm ci in clients/node
# A package whose directory is absent is skipped (said so); one present without its app fails.
# The packages' own unit tests are the client_go, client_python and client_node suites'.
# Then README.md's quick start runs as printed (the sh block that starts quickstart.py).
# One line per app, "conformance-NAME: N passed, M failed"; ends with "N passed, N failed".
#   CONFORMANCE_CLIENTS=DIR   another clients/ directory (default: the tree's)
#   CONFORMANCE_GO_DIR, CONFORMANCE_PYTHON_DIR, CONFORMANCE_NODE_DIR   one package's directory
#   CONFORMANCE_ONLY="go node"   only these apps (names as above, or a prefix: python)
#   CONFORMANCE_SEED=N        the client's seed (printed)
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
# node and npm may come from elsewhere (nodesource); install Debian's only when absent.
command -v node >/dev/null || IDEM_PACKAGES+=(nodejs)
command -v npm >/dev/null || IDEM_PACKAGES+=(npm)
IDEM_PACKAGES+=(golang-go golang-github-jackc-pgx-v4-dev python3-psycopg python3-flask python3-fastapi
  python3-starlette python3-uvicorn python3-django curl)
ensure_packages
build_and_install
idem_scratch_init

PY=/usr/bin/python3 # Debian's python, which has the framework packages (not a pyenv shim)
CLIENTS="${CONFORMANCE_CLIENTS:-$IDEM_ROOT/clients}"
GO_DIR="${CONFORMANCE_GO_DIR:-$CLIENTS/go}"
PY_DIR="${CONFORMANCE_PYTHON_DIR:-$CLIENTS/python}"
NODE_DIR="${CONFORMANCE_NODE_DIR:-$CLIENTS/node}"
SEED="${CONFORMANCE_SEED:-20261205}"
CLIENT="$IDEM_ROOT/clients/conformance/conformance.py"
OUT="$IDEM_SCRATCH/conformance"
mkdir -p "$OUT"
chmod 755 "$OUT"
PASSED=0 FAILED=0
ok() { echo "ok - $1"; PASSED=$((PASSED + 1)); }
not_ok() { echo "not ok - $1"; FAILED=$((FAILED + 1)); }
wanted_app() { # NAME: in CONFORMANCE_ONLY (a name or a prefix), or no list given
  [[ -z ${CONFORMANCE_ONLY:-} ]] && return 0
  local w
  for w in $CONFORMANCE_ONLY; do [[ $1 == "$w" || $1 == "$w"-* ]] && return 0; done
  return 1
}

# The server: TCP on 127.0.0.1 (every driver connects the same way), and a search_path that
# does not name the extension's schema, as users' servers have it: the packages qualify.
PORT="$(idem_free_port 5500 5504)" || idem_die "no free port in 5500-5504"
cluster_start "$IDEM_SCRATCH/pg" "$PORT" "listen_addresses = '127.0.0.1'" \
  "search_path = '\"\$user\", public'" "max_connections = 300" "track_commit_timestamp = on" || idem_die "could not start a server"
q() { psql -X -qAt -v ON_ERROR_STOP=1 "$@"; }
q -d postgres -c "CREATE ROLE app LOGIN" >/dev/null

# fresh_db NAME: a new database with the contract's set-up; prints the app's DATABASE_URL.
fresh_db() {
  q -d postgres -c "SET client_min_messages = warning" -c "DROP DATABASE IF EXISTS $1 WITH (FORCE)" \
    -c "CREATE DATABASE $1" >/dev/null &&
    q -d "$1" >/dev/null <<'SQL' && echo "postgresql://app@127.0.0.1:$PORT/$1"
CREATE EXTENSION idempotency;
GRANT USAGE ON SCHEMA idempotency TO app;
CREATE TABLE payments (id bigserial PRIMARY KEY, tenant text NOT NULL, amount int NOT NULL, note text);
ALTER TABLE payments OWNER TO app;
SQL
}

# conform NAME DIR CMD...: conformance.py against the app CMD (run in DIR) on a fresh database.
conform() {
  local name="$1" dir="$2" url http log line p f
  shift 2
  url="$(fresh_db "conf_${name//-/_}")" || { not_ok "conformance-$name: could not make its database"; return; }
  http="$(idem_free_port $((PORT + 1)) 5509)" || { not_ok "conformance-$name: no free port in 5500-5509"; return; }
  log="$OUT/$name.log"
  (cd "$dir" && "$PY" "$CLIENT" --name "$name" --port "$http" --database-url "$url" --seed "$SEED" \
    --admin-url "postgresql://postgres@127.0.0.1:$PORT/${url##*/}" --log "$OUT/$name.app.log" -- "$@") >"$log" 2>&1
  grep -E '^(not ok|#)' "$log" | sed 's/^/    /'
  line="$(grep -E "^conformance-$name: [0-9]+ passed, [0-9]+ failed$" "$log" | tail -1)"
  if [[ -z $line ]]; then
    sed 's/^/    | /' "$log" | tail -40
    not_ok "conformance-$name: the client printed no summary (see $log)"
    return
  fi
  echo "$line"
  read -r p _ f _ <<<"${line#*: }"
  PASSED=$((PASSED + p))
  FAILED=$((FAILED + f))
  if ((f > 0)); then
    echo "    --- the app's output ($OUT/$name.app.log, last 30 lines) ---"
    tail -30 "$OUT/$name.app.log" | sed 's/^/    | /'
  fi
}

apps=0
# --- Go --------------------------------------------------------------------------------
# Offline, with Debian's Go and the modules Debian ships in /usr/share/gocode (no module proxy):
# the package's offline.sh (GOPATH mode over Debian's packages).
go_offline() { (cd "$GO_DIR" && PATH="/usr/bin:$PATH" IDEM_GOPATH="$OUT/gopath" sh ./offline.sh "$@"); }
if ! wanted_app go; then
  :
elif [[ ! -d $GO_DIR ]]; then
  echo "# $GO_DIR is absent: no Go package to test"
elif [[ ! -d $GO_DIR/cmd/conformance-app || ! -f $GO_DIR/offline.sh ]]; then
  not_ok "conformance-go: $GO_DIR has no cmd/conformance-app or no offline.sh"
else
  apps=$((apps + 1))
  echo "# go $(go version | awk '{print $3}'): building cmd/conformance-app offline (offline.sh)"
  if go_offline go build -o "$OUT/conformance-app" ./cmd/conformance-app >"$OUT/go-build.log" 2>&1; then
    conform go "$GO_DIR" "$OUT/conformance-app"
  else
    sed 's/^/    | /' "$OUT/go-build.log"
    not_ok "conformance-go: cmd/conformance-app does not build"
  fi
fi

# --- Python ----------------------------------------------------------------------------
for fw in flask fastapi django; do
  wanted_app "python-$fw" || continue
  if [[ ! -d $PY_DIR ]]; then
    [[ $fw == flask ]] && echo "# $PY_DIR is absent: no Python package to test"
    continue
  fi
  if [[ ! -f $PY_DIR/conformance_app.py ]]; then
    not_ok "conformance-python-$fw: $PY_DIR has no conformance_app.py"
    continue
  fi
  apps=$((apps + 1))
  # The package from its source tree, as `pip install ./clients/python` would give it.
  PYTHONPATH="$PY_DIR${PYTHONPATH:+:$PYTHONPATH}" conform "python-$fw" "$PY_DIR" "$PY" "$PY_DIR/conformance_app.py" "$fw"
done

# --- Node ------------------------------------------------------------------------------
if ! wanted_app node; then
  :
elif [[ ! -d $NODE_DIR ]]; then
  echo "# $NODE_DIR is absent: no Node package to test"
elif [[ ! -f $NODE_DIR/conformance-app.js ]]; then
  not_ok "conformance-node: $NODE_DIR has no conformance-app.js"
else
  apps=$((apps + 1))
  echo "# node $(node --version): npm ci in $NODE_DIR"
  # A copy of the package: npm ci writes node_modules, and the tree may be read-only.
  rm -rf "$OUT/node-pkg"
  mkdir -p "$OUT/node-pkg"
  (cd "$NODE_DIR" && tar --exclude=node_modules -cf - .) | (cd "$OUT/node-pkg" && tar -xf -)
  if (cd "$OUT/node-pkg" && npm ci --no-audit --no-fund) >"$OUT/npm-ci.log" 2>&1; then
    conform node "$OUT/node-pkg" node "$OUT/node-pkg/conformance-app.js"
  else
    sed 's/^/    | /' "$OUT/npm-ci.log" | tail -30
    not_ok "conformance-node: npm ci failed"
  fi
fi

# --- README.md's quick start, as printed ------------------------------------------------
# The sh block holding "flask --app quickstart" runs from a copy of the top directory holding
# the README's quickstart.py and clients/python, on a fresh database app owned by app, with this
# server's port and a free one for 5000 (the packages it installs are the suite's). It prints
# the output block after it, and made one payment. Then the flask server is stopped.
if wanted_app readme && [[ -d $PY_DIR ]]; then
  MDB=(/usr/bin/python3 "$IDEM_ROOT/test/docs/mdblocks.py")
  qs="$OUT/quickstart"
  rm -rf "$qs" && mkdir -p "$qs/clients"
  ln -s "$PY_DIR" "$qs/clients/python"
  "${MDB[@]}" block "$IDEM_ROOT/README.md" "FlaskIdempotency" >"$qs/quickstart.py"
  qs_port="$(idem_free_port $((PORT + 1)) 5509)" || idem_die "no free port in 5500-5509"
  # The whole sh block, but its apt-get line; 5000 is a free port here.
  "${MDB[@]}" block "$IDEM_ROOT/README.md" "flask --app quickstart" | grep -v '^apt-get ' |
    sed "s/5000/$qs_port/g" >"$qs/block.sh"
  q -d postgres -c "SET client_min_messages = warning" -c "DROP DATABASE IF EXISTS app WITH (FORCE)" \
    -c "CREATE DATABASE app OWNER app" >/dev/null
  q -d app -c "CREATE EXTENSION idempotency" -c "GRANT USAGE ON SCHEMA idempotency TO app" >/dev/null
  echo "# README.md quick start: $(grep -c . "$qs/block.sh") lines of its sh block, flask on 127.0.0.1:$qs_port"
  (cd "$qs" && exec env -u PGHOST -u PGUSER -u PGDATABASE PGPORT="$PORT" PATH="/usr/bin:$PATH" \
    setsid bash -e block.sh) >"$qs/out.txt" 2>"$qs/err.txt" &
  qs_pid=$!
  wait "$qs_pid"
  qs_rc=$?
  kill -TERM -- "-$qs_pid" 2>/dev/null # the flask server the block left running
  if ((qs_rc == 0)) && diff -u <("${MDB[@]}" output "$IDEM_ROOT/README.md" "flask --app quickstart" | sed 's/ *$//') \
    <(sed 's/ *$//' "$qs/out.txt") >"$qs/diff.txt"; then
    echo "ok - README.md quick start: runs as printed and prints what the README shows"
    PASSED=$((PASSED + 1))
  else
    sed 's/^/    | /' "$qs/diff.txt" "$qs/err.txt" | tail -30
    not_ok "README.md quick start (exit $qs_rc): its output differs from the README's"
  fi
  n="$(q -d app -c "SELECT count(*) FROM payments" 2>/dev/null)"
  if [[ $n == 1 ]]; then
    echo "ok - README.md quick start: one payment for the three requests"
    PASSED=$((PASSED + 1))
  else
    not_ok "README.md quick start: $n payments (want 1)"
  fi
fi

((apps > 0)) || not_ok "no conformance app found under $CLIENTS (go, python, node)"
echo "${PASSED} passed, ${FAILED} failed"
((FAILED == 0))
