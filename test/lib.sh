# shellcheck shell=bash disable=SC2034  # variables here are used by the scripts that source it
# Shared shell helpers for the test runner, the demo, the benchmarks and every suite in
# test/suites/. Source it from bash:   source "$(dirname "$0")/../test/lib.sh"
#
#   ensure_packages         install the Debian packages below that are missing
#   build_and_install       make && make install (once per run)
#   idem_scratch_init       a scratch dir the postgres user can write: $IDEM_SCRATCH
#   as_pg CMD...            run CMD as the postgres user (as yourself when not root)
#   cluster_start DIR [PORT] [CONF_LINE...]   throw-away server in DIR (sets PGHOST, PGPORT);
#                           CONF_LINEs are appended last, so "listen_addresses = '127.0.0.1'"
#                           adds TCP (pick PORT from your own range then)
#   cluster_stop DIR        stop it (the EXIT trap also stops every server left in
#                           $IDEM_SCRATCH and every DIR given to cluster_start)
#   idem_bg CMD...          start CMD in the background; killed by the EXIT trap
#
# Servers run as the unprivileged `postgres` user (initdb refuses root), listen on a
# unix socket in their own directory only, and have shared_preload_libraries =
# 'idempotency'. Nothing is left running when the script ends, fails or is interrupted.

# Debian packages every command of the project needs. Suites that need more add to this
# array with a one-line edit (or `IDEM_PACKAGES+=(pkg)` before calling ensure_packages).
IDEM_PACKAGES=(
  postgresql-15
  postgresql-server-dev-15
  postgresql-15-pgtap
  libtap-parser-sourcehandler-pgtap-perl
  libipc-run-perl
  python3-psycopg
  libfaketime
  pgbouncer
  postgresql-15-pgaudit
  postgresql-15-cron
  make
  g++
)

IDEM_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# The PostgreSQL installation everything runs against: Debian's 15 by default, or the one
# whose pg_config PG_CONFIG names (`make test PG_CONFIG=/opt/pg17/bin/pg_config`, a server
# built by test/build-postgres.sh; test/matrix.sh runs every suite for several).
IDEM_DEBIAN_PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config
IDEM_PG_CONFIG="${PG_CONFIG:-$IDEM_DEBIAN_PG_CONFIG}"
[[ $IDEM_PG_CONFIG == */* ]] || IDEM_PG_CONFIG="$(command -v "$IDEM_PG_CONFIG" || echo "$IDEM_PG_CONFIG")"
# Debian's own server (installed from packages by ensure_packages), or one built elsewhere.
idem_debian_server() { [[ $IDEM_PG_CONFIG == "$IDEM_DEBIAN_PG_CONFIG" ]]; }
if idem_debian_server; then
  IDEM_PG_MAJOR=15
  IDEM_PG_BIN="/usr/lib/postgresql/${IDEM_PG_MAJOR}/bin"
  IDEM_PGXS_DIR="/usr/lib/postgresql/${IDEM_PG_MAJOR}/lib/pgxs"
else
  [[ -x $IDEM_PG_CONFIG ]] || { printf 'error: PG_CONFIG=%s is not an executable pg_config\n' "$IDEM_PG_CONFIG" >&2; exit 1; }
  IDEM_PG_MAJOR="$("$IDEM_PG_CONFIG" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')"
  IDEM_PG_BIN="$("$IDEM_PG_CONFIG" --bindir)"
  IDEM_PGXS_DIR="$(dirname "$(dirname "$(dirname "$("$IDEM_PG_CONFIG" --pgxs)")")")"
  # The server packages are Debian's 15; another server brings its own (and its pgTAP).
  idem_kept=()
  for idem_pkg in "${IDEM_PACKAGES[@]}"; do
    [[ $idem_pkg == postgresql-15 || $idem_pkg == postgresql-server-dev-15 ||
      $idem_pkg == postgresql-15-pgtap || $idem_pkg == postgresql-15-pgaudit ]] || idem_kept+=("$idem_pkg")
  done
  IDEM_PACKAGES=("${idem_kept[@]}")
  unset idem_kept idem_pkg
  # The PostgreSQL client packages still bring pg_prove's and psycopg's dependencies.
  IDEM_PACKAGES+=(postgresql-client-common)
fi
IDEM_PG_REGRESS="${IDEM_PGXS_DIR}/src/test/regress/pg_regress"
IDEM_PG_ISOLATION_REGRESS="${IDEM_PGXS_DIR}/src/test/isolation/pg_isolation_regress"
IDEM_PERL_TEST_LIB="${IDEM_PGXS_DIR}/src/test/perl"
export PATH="${IDEM_PG_BIN}:${PATH}"
export DEBIAN_FRONTEND=noninteractive

idem_is_root() { [[ "$(id -u)" == 0 ]]; }
idem_log() { printf '%s\n' "$*" >&2; }
idem_die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# --- packages ------------------------------------------------------------------------

idem_missing_packages() {
  local pkg
  for pkg in "${IDEM_PACKAGES[@]}"; do
    [[ -n $pkg ]] || continue
    dpkg-query -W -f='${Status}\n' "$pkg" 2>/dev/null | grep -q '^install ok installed$' ||
      printf '%s\n' "$pkg"
  done
}

ensure_packages() {
  local -a missing
  mapfile -t missing < <(idem_missing_packages)
  ((${#missing[@]} == 0)) && return 0
  if ! idem_is_root; then
    idem_log "These Debian packages are missing: ${missing[*]}"
    idem_log "Installing them needs root. Run:"
    idem_log "  sudo apt-get update && sudo apt-get install -y --no-install-recommends ${missing[*]}"
    exit 1
  fi
  idem_log "Installing Debian packages: ${missing[*]}"
  # Installing postgresql-15 would start the system cluster on port 5432; nothing here
  # uses it, so services are not started during the install (unless a policy exists).
  local policy=/usr/sbin/policy-rc.d made_policy=0
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && made_policy=1
  fi
  local rc=0 log step deadline=$((SECONDS + 600))
  log="$(mktemp /tmp/idempotency-apt.XXXXXX)"
  # Another apt or dpkg (unattended-upgrades, a second run) may hold the package manager's
  # locks: wait for them, up to 10 minutes, instead of failing. apt-get install waits by
  # itself (DPkg::Lock::Timeout); apt-get update does not wait for the lists' lock (apt 2.6),
  # so a step refused for a lock is tried again until the deadline.
  for step in update install; do
    while :; do
      rc=0
      if [[ $step == update ]]; then
        apt-get -o DPkg::Lock::Timeout=600 update -qq >"$log.step" 2>&1 || rc=$?
      else
        apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends "${missing[@]}" \
          >"$log.step" 2>&1 || rc=$?
      fi
      cat "$log.step" >>"$log"
      ((rc != 0)) && grep -q 'Could not get lock' "$log.step" && ((SECONDS < deadline)) || break
      idem_log "apt-get $step: the package manager is busy (another apt or dpkg); waiting ..."
      sleep 5
    done
    rm -f "$log.step"
    ((rc == 0)) || break
  done
  ((made_policy)) && rm -f "$policy"
  if ((rc != 0)); then
    tail -30 "$log" >&2
    idem_die "apt-get $step failed (exit $rc); the whole log is $log"
  fi
  rm -f "$log"
  mapfile -t missing < <(idem_missing_packages)
  ((${#missing[@]} == 0)) || idem_die "still missing after apt-get install: ${missing[*]}"
}

# --- build ---------------------------------------------------------------------------

# True when the installed extension files are byte-identical to the built ones.
idem_installed_is_current() {
  local pkglib share
  pkglib="$("$IDEM_PG_CONFIG" --pkglibdir)" && share="$("$IDEM_PG_CONFIG" --sharedir)" || return 1
  cmp -s "$IDEM_ROOT/idempotency.so" "$pkglib/idempotency.so" &&
    cmp -s "$IDEM_ROOT/idempotency.control" "$share/extension/idempotency.control" || return 1
  local script
  for script in "$IDEM_ROOT"/idempotency--*.sql; do # the base and every update script
    cmp -s "$script" "$share/extension/$(basename "$script")" || return 1
  done
}

build_and_install() {
  [[ ${IDEM_BUILT:-} == 1 ]] && return 0
  local jobs
  jobs="$(nproc 2>/dev/null || echo 2)"
  idem_log "Building (make -j$jobs) ..."
  # Serialized: two runs in one tree must not compile the same objects at once.
  mkdir -p "$IDEM_ROOT/.test-run"
  (
    flock 9
    # Objects built for another major are not reused (their headers differ).
    # The stamp names the installation the objects in the tree are for; it is written
    # before building, so an interrupted build leaves only objects of that installation.
    stamp="$IDEM_ROOT/.test-run/built-with"
    if [[ "$(cat "$stamp" 2>/dev/null)" != "$IDEM_PG_CONFIG" ]]; then
      make -s -C "$IDEM_ROOT" clean PG_CONFIG="$IDEM_PG_CONFIG" >/dev/null 2>&1 || true
      echo "$IDEM_PG_CONFIG" >"$stamp"
    fi
    make -s -C "$IDEM_ROOT" -j"$jobs" PG_CONFIG="$IDEM_PG_CONFIG" >&2 || exit 1
    if idem_is_root; then
      make -s -C "$IDEM_ROOT" install PG_CONFIG="$IDEM_PG_CONFIG" >/dev/null || exit 1
    elif ! idem_installed_is_current; then
      idem_log "The extension is built but not installed: 'make install' copies it into"
      idem_log "$("$IDEM_PG_CONFIG" --pkglibdir) and $("$IDEM_PG_CONFIG" --sharedir)/extension,"
      idem_log "which needs root. Run:  sudo make install   (or run this command with sudo)"
      exit 2
    fi
  ) 9>"$IDEM_ROOT/.test-run/build.lock" || idem_die "build or install failed"
  export IDEM_BUILT=1
}

# --- running as postgres ----------------------------------------------------------------

IDEM_PG_USER=postgres
idem_is_root || IDEM_PG_USER="$(id -un)"

# Runs a command as the postgres user with the current environment (and PATH with the
# PostgreSQL 15 binaries first), from a directory that user can read.
as_pg() {
  local dir="${IDEM_SCRATCH:-/tmp}"
  if idem_is_root; then
    (cd "$dir" && runuser -u postgres -m -- env HOME="$dir" PATH="$PATH" "$@")
  else
    (cd "$dir" && "$@")
  fi
}

export -f as_pg idem_is_root

# Can the postgres user traverse every directory down to $1?
idem_pg_can_reach() {
  if idem_is_root; then runuser -u postgres -- test -x "$1" 2>/dev/null; else test -x "$1"; fi
}

# idem_count_run LOG: adds the last "N passed, N failed" line of a run's LOG to the suite's
# PASSED and FAILED; a run that printed none counts as one failure.
idem_count_run() {
  local line p f
  line="$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$1" | tail -1)"
  if [[ -z $line ]]; then
    echo "not ok - the run printed no summary (see $1)"
    FAILED=$((FAILED + 1))
    return
  fi
  read -r p _ f _ <<<"$line"
  PASSED=$((PASSED + p))
  FAILED=$((FAILED + f))
}

# idem_count_caught LOG PATTERN SABOTAGE: a harness self-test passes when the run with
# SABOTAGE printed "not ok - PATTERN..." in LOG (the harness noticed); counts it in PASSED
# or FAILED.
idem_count_caught() {
  if grep -q "^not ok - $2" "$1"; then
    echo "ok - self-test: sabotage '$3' is caught ($2)"
    PASSED=$((PASSED + 1))
  else
    echo "not ok - self-test: sabotage '$3' went unnoticed (see $1)"
    FAILED=$((FAILED + 1))
  fi
}

# A scratch directory owned by the postgres user: project-local .test-run/run-<pid> when
# postgres can reach the project, else /tmp/idempotency-test-<uid>/run-<pid>. Copies
# sql/, expected/ and test/ into $IDEM_SRC ($IDEM_SCRATCH/src), where every suite reads
# its inputs. Removed when the script succeeds (unless IDEM_KEEP_SCRATCH is set).
idem_scratch_init() {
  # A suite started by test/run.sh gets its own scratch dir and the shared input copy.
  if [[ -n ${IDEM_SCRATCH:-} && -d ${IDEM_SCRATCH:-} ]]; then
    IDEM_SRC="${IDEM_SRC:-$IDEM_SCRATCH/src}"
    idem_install_traps
    return 0
  fi
  local base="$IDEM_ROOT/.test-run"
  mkdir -p "$base"
  # postgres cannot enter the project (a clone under /root, say): work under /tmp.
  idem_pg_can_reach "$base" || base="/tmp/idempotency-test-$(id -u)"
  mkdir -p "$base"
  chmod 755 "$base"
  # Runs that ended without their trap (kill -9) or failed leave a dir behind: reap those
  # whose runner is gone, stopping any server still running in them first.
  local old pid
  for old in "$base"/run-*; do
    [[ -d $old ]] || continue
    pid="${old##*/run-}"
    if ! kill -0 "$pid" 2>/dev/null; then
      idem_stop_servers_under "$old"
      rm -rf "$old"
    fi
  done
  IDEM_SCRATCH="$base/run-$$"
  rm -rf "$IDEM_SCRATCH"
  mkdir -p "$IDEM_SCRATCH"
  idem_is_root && chown -R postgres: "$base" "$IDEM_SCRATCH" 2>/dev/null
  chmod 755 "$IDEM_SCRATCH"
  mkdir -p "$IDEM_SCRATCH/src"
  local d
  for d in sql expected test portable; do
    [[ -d $IDEM_ROOT/$d ]] && cp -r "$IDEM_ROOT/$d" "$IDEM_SCRATCH/src/"
  done
  # The portable edition's one-file install, as `make -C portable` writes it.
  rm -rf "$IDEM_SCRATCH/src/portable/dist"
  mkdir -p "$IDEM_SCRATCH/src/portable/dist"
  bash "$IDEM_ROOT/portable/tools/generate.sh" psql >"$IDEM_SCRATCH/src/portable/dist/idempotency-portable.sql"
  idem_is_root && chown -R postgres: "$IDEM_SCRATCH"
  export IDEM_SCRATCH IDEM_SRC="$IDEM_SCRATCH/src"
  idem_install_traps
}

# The EXIT trap stops what this script started; signals end the script through it.
idem_install_traps() {
  [[ ${IDEM_TRAPS:-} == "$$" ]] && return 0
  IDEM_TRAPS=$$
  trap idem_on_exit EXIT
  trap 'idem_on_signal 130' INT
  trap 'idem_on_signal 143' TERM
  trap 'idem_on_signal 129' HUP
}

# --- throw-away servers ---------------------------------------------------------------

IDEM_CLUSTERS=()
IDEM_BG_PIDS=()

# First port in [low, high] with no TCP listener on loopback and no socket lock in
# /tmp or /var/run/postgresql (servers here use private socket dirs, so this only
# keeps clear of other people's servers).
idem_free_port() {
  local low="${1:-5440}" high="${2:-5449}" p
  for ((p = low; p <= high; p++)); do
    [[ -e /tmp/.s.PGSQL.$p.lock || -e /var/run/postgresql/.s.PGSQL.$p.lock ]] && continue
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && continue
    printf '%s\n' "$p"
    return 0
  done
  return 1
}

# cluster_start DIR [PORT] [CONF_LINE...]: initdb DIR/data as postgres, start it with
# its socket in DIR, and export PGHOST / PGPORT / PGUSER / PGDATABASE for it. Returns
# non-zero (with the log's tail on stderr) when the server cannot start.
cluster_start() {
  local dir="$1" port="${2:-}"
  shift $(($# >= 2 ? 2 : 1))
  if [[ -z $port ]]; then
    port="$(idem_free_port 5440 5449)" || { idem_log "error: no free port in 5440-5449"; return 1; }
  fi
  idem_install_traps
  [[ -d $dir ]] || mkdir -p "$dir"
  idem_is_root && chown postgres: "$dir"
  idem_stop_servers_under "$dir"
  as_pg rm -rf "$dir/data"
  as_pg initdb -D "$dir/data" -U postgres -A trust -E UTF8 --no-locale --no-sync \
    >"$dir/initdb.log" 2>&1 || {
    tail -20 "$dir/initdb.log" >&2
    idem_log "error: initdb failed in $dir"
    return 1
  }
  {
    echo "# added by test/lib.sh"
    echo "port = $port"
    echo "listen_addresses = ''"
    echo "unix_socket_directories = '$dir'"
    echo "shared_preload_libraries = 'idempotency'"
    echo "fsync = off"
    echo "max_prepared_transactions = 10"
    # Test SQL calls the extension's functions (schema idempotency) unqualified; the demo
    # and the examples do not rely on this.
    echo "search_path = '\"\$user\", public, idempotency'"
    local line
    for line in "$@"; do echo "$line"; done
  } | as_pg tee -a "$dir/data/postgresql.conf" >/dev/null
  IDEM_CLUSTERS+=("$dir")
  as_pg pg_ctl -D "$dir/data" -l "$dir/server.log" -w -t 60 start >/dev/null || {
    tail -30 "$dir/server.log" >&2
    idem_log "error: the server in $dir did not start"
    return 1
  }
  export PGHOST="$dir" PGPORT="$port" PGUSER=postgres PGDATABASE=postgres
}

cluster_stop() {
  local dir="$1"
  # Later commands must not reach for a server that is gone.
  [[ ${PGHOST:-} == "$dir" ]] && unset PGHOST PGPORT PGUSER PGDATABASE
  [[ -f $dir/data/postmaster.pid ]] || return 0
  as_pg pg_ctl -D "$dir/data" -m fast -w -t 30 stop >/dev/null 2>&1 ||
    as_pg pg_ctl -D "$dir/data" -m immediate -w -t 30 stop >/dev/null 2>&1 || true
}

# psql as postgres against the server of the last cluster_start, stopping at the first
# error, without reading ~/.psqlrc.
pg_psql() { as_pg psql -X -q -v ON_ERROR_STOP=1 "$@"; }

# Stops every server whose data directory (postmaster.pid) lies under $1: servers of
# cluster_start, pg_regress --temp-instance and PostgreSQL::Test::Cluster alike.
idem_stop_servers_under() {
  local root="$1" pidfile data pid
  [[ -d $root ]] || return 0
  while IFS= read -r pidfile; do
    data="$(dirname "$pidfile")"
    pid="$(head -1 "$pidfile" 2>/dev/null)"
    [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || continue
    as_pg pg_ctl -D "$data" -m immediate -w -t 20 stop >/dev/null 2>&1 ||
      kill -KILL "$pid" 2>/dev/null || true
  done < <(find "$root" -name postmaster.pid -type f 2>/dev/null)
}

# idem_bg CMD...: start CMD in the background and remember it for the EXIT trap.
idem_bg() {
  idem_install_traps
  "$@" &
  IDEM_BG_PIDS+=("$!")
}

idem_cleanup() {
  local pid dir
  for pid in "${IDEM_BG_PIDS[@]}"; do
    # A job started under `set -m` leads its own process group: end all of it.
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  IDEM_BG_PIDS=()
  for dir in "${IDEM_CLUSTERS[@]}"; do cluster_stop "$dir"; done
  IDEM_CLUSTERS=()
  [[ -n ${IDEM_SCRATCH:-} ]] && idem_stop_servers_under "$IDEM_SCRATCH"
  return 0
}

idem_on_exit() {
  local rc=$?
  idem_cleanup
  # Keep the scratch dir of a failed run for inspection (the next run reaps it).
  if [[ -n ${IDEM_SCRATCH:-} && $rc == 0 && -z ${IDEM_KEEP_SCRATCH:-} ]]; then
    rm -rf "$IDEM_SCRATCH"
  fi
  exit "$rc"
}

idem_on_signal() {
  trap - INT TERM HUP
  idem_log "interrupted: stopping servers"
  exit "$1" # runs idem_on_exit
}
