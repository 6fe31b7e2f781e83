#!/usr/bin/env bash
# The version matrix: every suite of `make test` against each PostgreSQL installation given,
# one after the other, then one table of version x suite (passed / failed).
#
#   test/matrix.sh PG_CONFIG... [-- SUITE...]
#   e.g. test/matrix.sh /usr/lib/postgresql/15/bin/pg_config /opt/pg16/bin/pg_config \
#          /opt/pg17/bin/pg_config /opt/pg18/bin/pg_config
#
# Servers other than Debian's 15 come from test/build-postgres.sh (CONTRIBUTING.md). The
# logs stay in .test-run/matrix/<major>.log. Exits non-zero when any cell failed.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
configs=()
suites=()
while (($#)); do
  if [[ $1 == -- ]]; then
    shift
    suites=("$@")
    break
  fi
  configs+=("$1")
  shift
done
((${#configs[@]})) || { sed -n '2,10p' "$0" >&2; exit 2; }

out="$root/.test-run/matrix"
mkdir -p "$out"
declare -A cell=()
declare -A seen_suite=()
order=()
versions=()
status=0
for config in "${configs[@]}"; do
  version="$("$config" --version 2>/dev/null | sed -E 's/^PostgreSQL //')" || version="$config"
  versions+=("$version")
  log="$out/${version// /_}.log"
  echo "== PostgreSQL $version ($config): log $log"
  # tap:050_pg_upgrade upgrades from the previous installation given (not from Debian's
  # 15, whose clusters stock servers refuse in pg_upgrade).
  upgrade=()
  if [[ -n ${previous:-} && $previous != /usr/lib/postgresql/* ]]; then
    upgrade=(IDEM_UPGRADE_OLD="$(dirname "$(dirname "$previous")")"
      IDEM_UPGRADE_NEW="$(dirname "$(dirname "$config")")")
  fi
  previous="$config"
  env "${upgrade[@]}" PG_CONFIG="$config" bash "$root/test/run.sh" "${suites[@]}" >"$log" 2>&1 || status=1
  # The runner's summary block: "  NAME   P passed, F failed  NOTE".
  while read -r name passed _ failed _; do
    [[ -n ${seen_suite[$name]:-} ]] || { seen_suite[$name]=1; order+=("$name"); }
    cell["$version|$name"]="$passed/$failed"
  done < <(sed -n '/^== summary/,$p' "$log" | grep -E '^  [^ ]+ +[0-9]+ passed, +[0-9]+ failed' |
    sed -E 's/^  ([^ ]+) +([0-9]+) passed, +([0-9]+) failed.*/\1 \2 x \3 x/')
  tail -1 "$log"
done

printf '\n| suite (passed/failed) |'
for v in "${versions[@]}"; do printf ' %s |' "$v"; done
printf '\n|---|'
for _ in "${versions[@]}"; do printf '%s' '---|'; done
printf '\n'
for name in "${order[@]}"; do
  printf '| %s |' "$name"
  for v in "${versions[@]}"; do printf ' %s |' "${cell["$v|$name"]:--}"; done
  printf '\n'
done
exit "$status"
