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
# again at the end. Prints one line per mutant (killed, survived, NOT APPLIED when the
# expression matched nothing, BROKEN when the mutant did not build) with what went red, and
# a closing "N passed, N failed" (a killed mutant passes). The logs stay in
# .test-run/mutants/. A mutant whose suites are "build" must be refused by the compiler (a
# static assertion: code checked at compile time, like src/siphash.hpp's vectors).
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
source "$root/test/lib.sh"

ensure_packages
build_and_install
scratch="$(mktemp -d /tmp/idempotency-mutants.XXXXXX)"
chmod 755 "$scratch"
# The logs of the last run, one per mutant.
logs="$root/.test-run/mutants"
rm -rf "$logs"
mkdir -p "$logs"
# Reinstalls the unmutated build the way build_and_install does (under its lock, rebuilt
# first if another run in this tree built it for another installation meanwhile).
reinstall() { (unset IDEM_BUILT && build_and_install) >/dev/null 2>&1; }
trap 'reinstall; rm -rf "$scratch"' EXIT

declare -A wanted=()
for name in "$@"; do wanted["$name"]=1; done

# killed_by LOG: what went red in a run of test/run.sh, suite by suite: the regress tests
# and isolation specs that failed, the pgTAP runs (file, or file.path) with a failed
# assertion or a difference between paths, the TAP files, the extra suites.
killed_by() {
  awk '
    function add(suite, what) {
      if (!(suite in names)) order[++n] = suite
      if (index(" " names[suite] " ", " " what " ") == 0) names[suite] = names[suite] (names[suite] == "" ? "" : " ") what
    }
    /^== (regress|isolation|pgtap|tap):/ { suite = $2; sub(/:$/, "", suite); next }
    /^== suite / { suite = "suite:" $3; next }
    /^== summary/ { suite = "summary"; next }
    suite == "regress" || suite == "isolation" {
      line = $0; sub(/^ +/, "", line)
      if (line ~ /^not ok [0-9]+ +[-+] /) { sub(/^not ok [0-9]+ +[-+] +/, "", line); sub(/ .*/, "", line); add(suite, line) }
      else if (line ~ /^(test )?[^ ]+ +\.\.\. +FAILED/) { sub(/^test +/, "", line); sub(/ .*/, "", line); add(suite, line) }
    }
    suite == "pgtap" {
      if ($0 ~ /^  -- [^ ]+$/) run = $2
      else if ($0 ~ /^    not ok [0-9]+/ && $0 !~ /# TODO/) add(suite, run)
      else if ($0 ~ /^    [^ ]+: (results differ|the [^ ]+ path was not taken|[0-9]+ assertion)/) add(suite, run)
    }
    suite == "tap" {
      if (match($0, /[^ \/]+\.pl \.\./)) file = substr($0, RSTART, RLENGTH - 6)
      else if ($0 ~ /^    not ok [0-9]+/ || $0 ~ /Dubious/) add(suite, file)
    }
    suite == "summary" && $1 ~ /^[a-z]/ && $0 ~ /passed, +[1-9][0-9]* failed/ && !($1 in names) { add($1, "") }
    END {
      for (i = 1; i <= n; i++) printf "%s%s%s", (i > 1 ? "; " : ""), order[i], (names[order[i]] == "" ? "" : ": " names[order[i]])
      if (n == 0) printf "(nothing red: the runner itself failed, see the log)"
    }' "$1"
}

killed=0 survived=0 number=0
rows=()
while IFS='|' read -r name file expression suites why; do
  [[ -z $name || $name == \#* ]] && continue
  ((${#wanted[@]} == 0)) || [[ -n ${wanted[$name]:-} ]] || continue
  # A short directory: the servers' sockets live below it, and a socket path has at most
  # 107 bytes (a long mutant name made servers fail to start, which looked like a kill).
  copy="$scratch/$((++number))"
  mkdir -p "$copy"
  # With the unmutated build's objects (and the stamp naming the installation they are for):
  # make then compiles only what the mutant changed, which it leaves newer than its object.
  tar -C "$root" --exclude=./.git --exclude=./.test-run --exclude=./bench/results -cf - . |
    tar -C "$copy" -xf -
  mkdir -p "$copy/.test-run"
  cp -p "$root/.test-run/built-with" "$copy/.test-run/" 2>/dev/null || true
  cp "$copy/$file" "$copy/$file.orig"
  perl -0pi -e "$expression" "$copy/$file"
  if cmp -s "$copy/$file" "$copy/$file.orig"; then
    rows+=("$(printf '%-30s %-8s        %s' "$name" "NOT APPLIED" "the expression matched nothing in $file")")
    survived=$((survived + 1))
    rm -rf "$copy"
    continue
  fi
  read -ra suite_list <<<"${suites:-regress isolation pgtap}"
  start=$SECONDS
  log="$logs/$name.log"
  if [[ $suites == build ]]; then
    # Code checked at compile time (src/siphash.hpp's reference vectors): the build must
    # refuse the mutant by a static assertion.
    if (cd "$copy" && make -s -j2 PG_CONFIG="$IDEM_PG_CONFIG") >"$log" 2>&1; then
      verdict=survived
      survived=$((survived + 1))
    elif grep -q 'static assertion failed' "$log"; then
      verdict=killed
      killed=$((killed + 1))
    else
      verdict=BROKEN
      survived=$((survived + 1))
    fi
  # The copy's own runner builds and installs the mutant, then runs the suites.
  elif (cd "$copy" && unset IDEM_BUILT IDEM_SCRATCH IDEM_SRC && bash test/run.sh "${suite_list[@]}") \
    >"$log" 2>&1; then
    verdict=survived
    survived=$((survived + 1))
  elif ! grep -q '^== summary' "$log" || grep -q '(could not start a server)' "$log"; then
    # It did not build (say -Werror on a variable the mutant left unused), the runner
    # stopped before the suites, or a server did not start: not a kill.
    verdict=BROKEN
    survived=$((survived + 1))
  else
    verdict=killed
    killed=$((killed + 1))
  fi
  rows+=("$(printf '%-30s %-8s %4ds  %s' "$name" "$verdict" $((SECONDS - start)) "$why")")
  if [[ $verdict == killed && $suites == build ]]; then
    rows+=("$(printf '%-30s by %s' '' "the build (a static assertion)")")
  elif [[ $verdict == killed ]]; then
    rows+=("$(printf '%-30s by %s' '' "$(killed_by "$log")")")
  fi
  rm -rf "$copy"
done <"$here/mutants.txt"

printf '%s\n' "${rows[@]}"
echo "(logs: $logs)"
echo "$killed passed, $survived failed"
((survived == 0))
