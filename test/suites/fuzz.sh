#!/usr/bin/env bash
# Hostile input for every SQL function (test/fuzz/fuzz.py): random and boundary values,
# an oracle from SPEC section 3 for every call, documented SQLSTATEs only, no row changed
# by a failing call, no server crash. Then every Unicode character in keys.
#   IDEM_FUZZ_CALLS=20000 bash test/suites/fuzz.sh     a longer run
#   IDEM_FUZZ_SEED=123 ...                             another run (the default seed is fixed; printed)
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

ensure_packages
build_and_install
idem_scratch_init

dir="$IDEM_SCRATCH/fuzz"
mkdir -p "$dir"
args=(--workdir "$dir" --port 5477 --calls "${IDEM_FUZZ_CALLS:-2000}")
[[ -n ${IDEM_FUZZ_SEED:-} ]] && args+=(--seed "$IDEM_FUZZ_SEED")
/usr/bin/python3 "$IDEM_ROOT/test/fuzz/fuzz.py" "${args[@]}"
