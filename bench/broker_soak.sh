#!/usr/bin/env bash
# The long run of the broker suite (issue #35): test/suites/broker.sh with many more messages
# and kills, for each package's consumer program on a throw-away RabbitMQ and PostgreSQL. By
# default 6,000 messages per mode and language (about 2.1 deliveries each: over 100,000
# deliveries in all), 10 CRASH_AFTER_COMMIT starts per mode and 4 SIGKILLs from outside per
# single / batch mode (114 kills), one PostgreSQL crash and restart per language. Figures per
# language ("# broker-LANG figures: ...") and the verdicts, counted: 0 double effects, 0 lost
# messages, every mismatch dead-lettered. docs/reliability.md quotes a run.
#   bash bench/broker_soak.sh                        (as root on Debian 12, like make test)
#   SOAK_MESSAGES=20000 SOAK_CRASH_KILLS=20 bash bench/broker_soak.sh
#   PG_CONFIG=/path/to/pg_config, BROKER_ONLY="go", BROKER_SEED=N as for the suite
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
messages="${SOAK_MESSAGES:-6000}"
crash="${SOAK_CRASH_KILLS:-10}"
sigkills="${SOAK_SIGKILLS:-4}"
echo "# broker soak: $messages messages per mode and language, $crash CRASH_AFTER_COMMIT starts per mode, $sigkills SIGKILLs per single / batch mode"
start=$SECONDS
BROKER_MESSAGES="$messages" \
  BROKER_HARNESS_ARGS="--crash-kills $crash --sigkills $sigkills --deadline 7200 ${BROKER_HARNESS_ARGS:-}" \
  bash "$here/test/suites/broker.sh"
rc=$?
echo "# broker soak: $((SECONDS - start)) s"
exit "$rc"
