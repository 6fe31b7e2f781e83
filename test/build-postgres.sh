#!/usr/bin/env bash
# Builds a PostgreSQL server from a source tree, with everything the test suites use, for
# the version matrix (test/matrix.sh): the server and its client programs, contrib
# (amcheck, pg_walinspect, pgcrypto, ...), the isolation tester, the TAP Perl modules
# (PostgreSQL::Test::Cluster), the test module test_oat_hooks, and pgTAP built for that server.
#
#   test/build-postgres.sh SRC PREFIX [PGTAP_SRC]
#
# SRC is an unpacked PostgreSQL source tree (a release tarball or a git checkout; it is
# built in place), PREFIX where to install it (say /opt/pg17), PGTAP_SRC an unpacked pgTAP
# tree (optional). About 6 to 8 minutes per major with two cores. As root it installs the
# Debian build dependencies first. CONTRIBUTING.md says where the source trees come from.
set -euo pipefail

if (($# < 2)); then
  sed -n '2,13p' "$0" >&2
  exit 2
fi
src="$(cd "$1" && pwd)"
prefix="$2"
pgtap="${3:-}"
jobs="$(nproc 2>/dev/null || echo 2)"

packages=(bison flex gcc make perl pkg-config libssl-dev zlib1g-dev libipc-run-perl)
if [[ $(id -u) == 0 ]]; then
  missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$p")
  done
  if ((${#missing[@]})); then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
  fi
fi

log="$src/build-postgres.log"
echo "building $src into $prefix (log: $log)"
cd "$src"
{
  ./configure --prefix="$prefix" --without-icu --without-readline --with-openssl --enable-tap-tests
  make -j"$jobs" world-bin
  make install-world-bin
  # Not part of install-world-bin: what PGXS's installcheck for isolation specs and the
  # Perl TAP tests need, and test_oat_hooks (it sets the permission and object-access hooks,
  # which send every read and write of a claim through the executor: TAP 045 uses it where
  # pgaudit is not installed).
  make -C src/test/isolation install
  make -C src/test/perl install
  make -C src/test/modules/test_oat_hooks install
} >"$log" 2>&1 || {
  tail -40 "$log" >&2
  echo "error: the build of $src failed; the whole log is $log" >&2
  exit 1
}

if [[ -n $pgtap ]]; then
  echo "building pgTAP from $pgtap for $prefix"
  make -C "$pgtap" PG_CONFIG="$prefix/bin/pg_config" >>"$log" 2>&1 &&
    make -C "$pgtap" PG_CONFIG="$prefix/bin/pg_config" install >>"$log" 2>&1 || {
    tail -20 "$log" >&2
    echo "error: pgTAP did not build for $prefix" >&2
    exit 1
  }
  # Leave the tree clean for the next major.
  make -C "$pgtap" PG_CONFIG="$prefix/bin/pg_config" clean >/dev/null 2>&1 || true
fi
"$prefix/bin/pg_config" --version
