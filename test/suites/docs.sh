#!/usr/bin/env bash
# Suite: the documentation cannot drift (test/docs/mdblocks.py says the conventions).
#   - every SQL block of README.md, CONTRIBUTING.md and docs/*.md runs, in page order, on a
#     fresh database, as the README tells a user to set it up (a superuser creates the
#     extension and grants USAGE; the application role `app` runs the blocks), on a server
#     whose search_path does not name the extension's schema; a block followed by a
#     ```text block must print exactly that; blocks marked <!-- not run: why --> are skipped
#   - excerpts of example files are word for word in those files; relative links and
#     their anchors resolve
#   - self-test: the README with one character of its first output block changed must fail
# Ends with "N passed, N failed".
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
ensure_packages
build_and_install
idem_scratch_init
cd "$IDEM_ROOT"

MD=(README.md CONTRIBUTING.md CHANGELOG.md SECURITY.md examples/README.md docs/*.md)
TOOL="$IDEM_ROOT/test/docs/mdblocks.py"
PASSED=0 FAILED=0

/usr/bin/python3 "$TOOL" static "${MD[@]}" | tee "$IDEM_SCRATCH/static.log"
idem_count_run "$IDEM_SCRATCH/static.log"

port="$(idem_free_port 5490 5499)" || idem_die "no free port in 5490-5499"
# A server as users have it: its search_path does not name the extension's schema.
cluster_start "$IDEM_SCRATCH/pg" "$port" "search_path = '\"\$user\", public'" ||
  idem_die "could not start a server"
/usr/bin/python3 "$TOOL" check "${MD[@]}" | tee "$IDEM_SCRATCH/check.log"
idem_count_run "$IDEM_SCRATCH/check.log"

echo "# self-test: README.md with its first output block changed"
/usr/bin/python3 "$TOOL" check README.md --mutate-first-output >"$IDEM_SCRATCH/mutated.log" 2>&1
if [[ $(grep -c '^not ok' "$IDEM_SCRATCH/mutated.log") == 1 ]] &&
  grep -qE '^[0-9]+ passed, 1 failed$' "$IDEM_SCRATCH/mutated.log"; then
  echo "ok - an edited output block makes the suite fail"
  PASSED=$((PASSED + 1))
else
  sed 's/^/    | /' "$IDEM_SCRATCH/mutated.log"
  echo "not ok - an edited output block went unnoticed"
  FAILED=$((FAILED + 1))
fi

echo "${PASSED} passed, ${FAILED} failed"
((FAILED == 0))
