#!/usr/bin/env bash
# The mutation habit (issue #16): each mutant in test/mutants/mutants.txt is one small
# semantic bug, applied to a scratch copy of the tree; the copy is built, installed, and the
# fast suites run against it. A mutant the suites do not notice "survived": either a test is
# missing, or the change is harmless (say why in the list).
#
#   test/mutants/run.sh [NAME...]      all mutants, or only those named
#
# It installs each mutant into the server's extension directory, like `make test` does, so
# run nothing else against that installation meanwhile (PG_CONFIG=... picks another one, say
# a copy of a server built by test/build-postgres.sh); the unmutated build is installed
# again at the end. Prints one line per mutant and a closing "N passed, N failed" (a killed
# mutant passes).
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
source "$root/test/lib.sh"

ensure_packages
build_and_install
scratch="$(mktemp -d /tmp/idempotency-mutants.XXXXXX)"
chmod 755 "$scratch"
trap 'make -s -C "$root" install PG_CONFIG="$IDEM_PG_CONFIG" >/dev/null 2>&1; rm -rf "$scratch"' EXIT

declare -A wanted=()
for name in "$@"; do wanted["$name"]=1; done

killed=0 survived=0
rows=()
while IFS='|' read -r name file expression suites why; do
  [[ -z $name || $name == \#* ]] && continue
  ((${#wanted[@]} == 0)) || [[ -n ${wanted[$name]:-} ]] || continue
  copy="$scratch/$name"
  mkdir -p "$copy"
  tar -C "$root" --exclude=./.git --exclude=./.test-run --exclude='*.o' --exclude='*.so' \
    --exclude=./bench/results -cf - . | tar -C "$copy" -xf -
  cp "$copy/$file" "$copy/$file.orig"
  perl -0pi -e "$expression" "$copy/$file"
  if cmp -s "$copy/$file" "$copy/$file.orig"; then
    rows+=("$(printf '%-28s %-9s %s' "$name" "NOT APPLIED" "the expression matched nothing in $file")")
    survived=$((survived + 1))
    continue
  fi
  read -ra suite_list <<<"${suites:-regress isolation pgtap}"
  start=$SECONDS
  # The copy's own runner builds and installs the mutant, then runs the suites.
  if (cd "$copy" && unset IDEM_BUILT IDEM_SCRATCH IDEM_SRC && bash test/run.sh "${suite_list[@]}") \
    >"$scratch/$name.log" 2>&1; then
    verdict=survived
    survived=$((survived + 1))
  else
    verdict=killed
    killed=$((killed + 1))
  fi
  rows+=("$(printf '%-28s %-9s %4ds  %s' "$name" "$verdict" $((SECONDS - start)) "$why")")
  [[ $verdict == survived ]] && cp "$scratch/$name.log" "/tmp/idempotency-mutant-$name.log"
  rm -rf "$copy"
done <"$here/mutants.txt"

printf '%s\n' "${rows[@]}"
echo "$killed passed, $survived failed"
((survived == 0))
