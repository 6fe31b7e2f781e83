#!/usr/bin/env bash
# The exactly-once harness on its own throw-away server (see test/chaos/chaos.py).
#
#   test/chaos/run.sh                 short run: 500 messages, 8 consumers, 1 server crash
#   test/chaos/run.sh --long          long run: 20000 messages, 16 consumers, 5 server crashes
#   test/chaos/run.sh --pgbouncer     the same through PgBouncer in transaction pooling mode
#   test/chaos/run.sh --patterns batch   batch consumers: up to --batch-size (20) deliveries per
#                                     transaction (claim_keys, effects, complete_keys, COMMIT);
#                                     --patterns inbox,2pc,batch mixes the three (default inbox,2pc)
#   test/chaos/run.sh [--long] [chaos.py run options...]   e.g. --seed 42 --consumers 12
#
# Prints the figures and ends with "N passed, N failed"; exits non-zero on any failure.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

declare -a opts=()
for arg in "$@"; do
  if [[ $arg == --long ]]; then
    opts+=(--messages 20000 --consumers 16 --crashes 5 --max-kills 800 --kill-rate 0.03 --max-stalls 60
      --tampered 200 --timeout 3000)
  else
    opts+=("$arg")
  fi
done

ensure_packages
build_and_install
idem_scratch_init
dir="$IDEM_SCRATCH/chaos-$$"
mkdir -p "$dir"
/usr/bin/python3 "$IDEM_ROOT/test/chaos/chaos.py" run --workdir "$dir" \
  --port "${IDEM_CHAOS_PORT:-5470}" "${opts[@]}"
