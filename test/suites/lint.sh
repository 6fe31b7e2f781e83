#!/usr/bin/env bash
# Style gate: clang-format, clang-tidy and the C++/PostgreSQL boundary check must be clean
# on src/ (three tests).
set -uo pipefail
source "$(dirname "$0")/../lib.sh"
IDEM_PACKAGES+=(clang-format clang-tidy)
ensure_packages
cd "$IDEM_ROOT"

passed=0 failed=0
if clang-format --dry-run -Werror src/*.cpp src/*.hpp src/pg/*.cpp src/pg/*.hpp; then
  echo "ok - clang-format"; passed=$((passed + 1))
else
  echo "not ok - clang-format (run: make format)"; failed=$((failed + 1))
fi
tidy_output="$(clang-tidy --quiet src/*.cpp src/pg/*.cpp -- -x c++ -std=c++17 -D_GNU_SOURCE \
  -isystem "$("$IDEM_PG_CONFIG" --includedir-server)" \
  -isystem "$("$IDEM_PG_CONFIG" --includedir)/internal" 2>&1)"
tidy_status=$?
if ((tidy_status == 0)) && ! grep -qE 'error:|warning:' <<<"$tidy_output"; then
  echo "ok - clang-tidy"; passed=$((passed + 1))
else
  grep -E 'error:|warning:' <<<"$tidy_output"
  echo "not ok - clang-tidy"; failed=$((failed + 1))
fi
# The boundary rule of src/pg_boundary.hpp (test/lint/boundary.py says what it checks).
if python3 test/lint/boundary.py; then
  echo "ok - boundary"; passed=$((passed + 1))
else
  echo "not ok - boundary (see src/pg_boundary.hpp)"; failed=$((failed + 1))
fi
echo "${passed} passed, ${failed} failed"
((failed == 0))
