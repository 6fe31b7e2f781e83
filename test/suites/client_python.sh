#!/usr/bin/env bash
# Suite: the Python package's own tests (clients/python/tests, pytest) against a throw-away
# server: key parsing (no server), the synchronous and asynchronous engines, the Flask,
# FastAPI and Django adapters in process, and the RabbitMQ consumer helpers with a
# simulated channel. The apps and the consumer program themselves are run by the
# conformance and broker suites. Counts pytest's passed and failed (errors count as failed),
# plus one check: pyflakes finds nothing in the package, its tests and its two programs.
# Ends with "N passed, N failed".
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
IDEM_PACKAGES+=(python3-pytest python3-flask python3-fastapi python3-starlette python3-httpx
  python3-django python3-pika python3-uvicorn python3-werkzeug python3-pyflakes)
ensure_packages
build_and_install
idem_scratch_init

DIR="$IDEM_SCRATCH/client-python"
mkdir -p "$DIR"
chmod 755 "$DIR"
cluster_start "$DIR/cluster" "$(idem_free_port 5510 5519)" >/dev/null || idem_die "no server"
pg_psql -d postgres -c "CREATE ROLE app LOGIN" -c "CREATE DATABASE app OWNER app" >/dev/null
pg_psql -d app -c "CREATE EXTENSION idempotency" -c "GRANT USAGE ON SCHEMA idempotency TO app" >/dev/null

# Debian's python3 (which has the packages), no bytecode or cache left in the tree.
export IDEM_TEST_DSN="host=$PGHOST port=$PGPORT dbname=app user=app"
export IDEM_TEST_ADMIN_DSN="host=$PGHOST port=$PGPORT dbname=app user=postgres"
export IDEM_TEST_REQUIRE_DB=1 PYTHONDONTWRITEBYTECODE=1
LOG="$DIR/pytest.log"
(cd "$IDEM_ROOT/clients/python" && /usr/bin/python3 -m pytest -p no:cacheprovider -q -rfE \
  --junitxml="$DIR/junit.xml" tests) >"$LOG" 2>&1
rc=$?
cat "$LOG"
# The counts from pytest's own report (testsuite attributes), not from its prose.
read -r passed failed < <(/usr/bin/python3 - "$DIR/junit.xml" <<'PY'
import sys
import xml.etree.ElementTree as ET
try:
    root = ET.parse(sys.argv[1]).getroot()
except (OSError, ET.ParseError):
    print(0, 1)
    sys.exit()
suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
t = sum(int(s.get("tests", 0)) for s in suites)
bad = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
skipped = sum(int(s.get("skipped", 0)) for s in suites)
print(t - bad - skipped, bad + skipped)  # nothing may be skipped here: a skip is a failure
PY
)
((rc != 0 && failed == 0)) && failed=1 && echo "not ok - pytest exited $rc"
PKG="$IDEM_ROOT/clients/python"
if /usr/bin/python3 -m pyflakes "$PKG/src" "$PKG/tests" "$PKG/conformance_app.py" "$PKG/conformance_consumer.py"; then
  echo "ok - pyflakes: clients/python is clean"
  passed=$((passed + 1))
else
  echo "not ok - pyflakes: clients/python has warnings (above)"
  failed=$((failed + 1))
fi
echo "$passed passed, $failed failed"
