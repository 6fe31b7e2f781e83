#!/usr/bin/env bash
# Suite: release metadata and the Debian package.
#   - the version is written once (idempotency.control's default_version): META.json,
#     its provides section, the extension script name and debian/changelog agree with it
#   - META.json follows the PGXN meta spec 1.0.0 (required keys, semantic versions) and
#     names the PostgreSQL majors of debian/pgversions
#   - debian/control is current with debian/control.in (pg_buildext checkcontrol)
#   - the README's commands, as printed: its apt-get line's packages are what this suite
#     installs, its dpkg-buildpackage line builds postgresql-15-idempotency from a copy of the
#     working tree (a git repository of its own, as a clone is) and leaves `git status` clean
#     there (.gitignore covers what debhelper writes), its dpkg -i line names the package built
#     and installs it; its files land; CREATE EXTENSION works on a throw-away server preloading
#     the packaged library. dpkg waits for the package manager's lock (up to 10 minutes)
#   - a PGXN release zip of the same copy installs with `pgxn install` (into a DESTDIR)
#   - then the package is removed and the previously installed files (`make install`'s)
#     are put back, so the rest of the run still has the extension as built from the tree.
#     (If the package was installed before the suite ran, it stays installed.)
# Ends with "N passed, N failed".
set -uo pipefail
source "$(dirname "$0")/../lib.sh"
if ! idem_debian_server; then
  # pg_buildext builds the package for Debian's own PostgreSQL packages (debian/pgversions):
  # a server built from source has none to build against.
  echo "# packaging builds Debian's postgresql-NN-idempotency; $("$IDEM_PG_CONFIG" --version) is not Debian's: nothing to run"
  echo "0 passed, 0 failed"
  exit 0
fi
MDB=(/usr/bin/python3 "$IDEM_ROOT/test/docs/mdblocks.py")
# The README's build commands ("Or build the Debian package"), as printed.
README_APT="$("${MDB[@]}" command "$IDEM_ROOT/README.md" "apt-get install --no-install-recommends build-essential")" ||
  idem_die "no apt-get line for the package build in README.md"
README_BUILD="$("${MDB[@]}" command "$IDEM_ROOT/README.md" "dpkg-buildpackage")" || idem_die "no dpkg-buildpackage line in README.md"
README_INSTALL="$("${MDB[@]}" command "$IDEM_ROOT/README.md" "dpkg -i")" || idem_die "no dpkg -i line in README.md"
read -ra readme_packages <<<"${README_APT#*--no-install-recommends }"
IDEM_PACKAGES+=("${readme_packages[@]}" dpkg-dev python3 pgxnclient)
ensure_packages
build_and_install
idem_scratch_init
cd "$IDEM_ROOT"

passed=0 failed=0
ok() { echo "ok - $1"; passed=$((passed + 1)); }
not_ok() { echo "not ok - $1"; failed=$((failed + 1)); }
check() { # NAME CMD...
  local name="$1"
  shift
  if "$@"; then ok "$name"; else not_ok "$name"; fi
}
same() { # NAME EXPECTED ACTUAL
  if [[ $2 == "$3" ]]; then ok "$1"; else not_ok "$1 (expected '$2', got '$3')"; fi
}
# with_dpkg_lock CMD...: CMD, run again while another apt or dpkg holds the package manager's
# lock (dpkg itself does not wait), for up to 10 minutes.
with_dpkg_lock() {
  local out rc deadline=$((SECONDS + 600))
  while :; do
    out="$("$@" 2>&1)" && rc=0 || rc=$?
    ((rc != 0)) && grep -qiE 'lock.*(locked|held) by|could not get lock' <<<"$out" && ((SECONDS < deadline)) || break
    echo "# $1: the package manager is busy (another apt or dpkg); waiting ..."
    sleep 5
  done
  printf '%s\n' "$out"
  return "$rc"
}

# --- one version -----------------------------------------------------------------------
VERSION="$(sed -n "s/^default_version *= *'\(.*\)'/\1/p" idempotency.control)"
[[ -n $VERSION ]] || idem_die "no default_version in idempotency.control"
# PGXN wants semantic versions: 1.0 -> 1.0.0
SEMVER="$VERSION"
[[ $SEMVER =~ ^[0-9]+\.[0-9]+$ ]] && SEMVER="$SEMVER.0"
echo "# idempotency.control default_version = $VERSION (PGXN $SEMVER)"

meta() { /usr/bin/python3 -c 'import json,sys; d=json.load(open("META.json"))
for k in sys.argv[1].split("."): d = d.get(k) if isinstance(d, dict) else None
print("" if d is None else d)' "$1"; }
check "META.json is valid JSON" /usr/bin/python3 -m json.tool META.json /dev/null
same "META.json version matches the control file" "$SEMVER" "$(meta version)"
same "META.json provides.idempotency.version matches" "$SEMVER" "$(meta provides.idempotency.version)"
same "META.json provides.idempotency.file is the extension script" \
  "idempotency--$VERSION.sql" "$(meta provides.idempotency.file)"
check "the extension script idempotency--$VERSION.sql exists" test -f "idempotency--$VERSION.sql"
missing=""
for k in name abstract maintainer license provides meta-spec.version; do
  [[ -n $(meta "$k") ]] || missing+=" $k"
done
same "META.json has every key the PGXN spec requires" "" "$missing"
same "META.json meta-spec version" "1.0.0" "$(meta meta-spec.version)"
same "META.json name is the extension name" "idempotency" "$(meta name)"
same "META.json's PostgreSQL range is the majors of debian/pgversions" \
  ">= $(sort -n debian/pgversions | head -1).0.0, < $(($(sort -n debian/pgversions | tail -1) + 1)).0.0" \
  "$(meta prereqs.runtime.requires.PostgreSQL)"
DEB_VERSION="$(dpkg-parsechangelog -S Version)"
same "debian/changelog upstream version matches the control file" "$VERSION" "${DEB_VERSION%-*}"
check "debian/control is current with control.in (pg_buildext checkcontrol)" \
  pg_buildext checkcontrol

# --- build the .deb from a copy of the working tree ------------------------------------
BUILD="$IDEM_SCRATCH/deb"
SRC="$BUILD/idempotency-$VERSION"
rm -rf "$BUILD"
mkdir -p "$SRC"
# Tracked and new files as they are in the work tree, without build products.
git ls-files -z --cached --others --exclude-standard |
  while IFS= read -r -d '' f; do [[ -e $f ]] && printf '%s\0' "$f"; done |
  tar -c --null -T - | tar -x -C "$SRC"
# As in a clone: its own git repository, every file committed.
(cd "$SRC" && git init -q && git add -A && git -c user.name=packaging -c user.email=packaging@localhost \
  commit -q -m "the tree as built") || idem_die "could not make a git repository of $SRC"
echo "# README.md: $README_BUILD (in $SRC)"
start=$SECONDS
# shellcheck disable=SC2086  # the README's command line, word for word
(cd "$SRC" && DEB_BUILD_OPTIONS="parallel=$(nproc)" $README_BUILD) >"$BUILD/build.log" 2>&1
rc=$?
echo "# build took $((SECONDS - start)) s"
DEB="$BUILD/postgresql-${IDEM_PG_MAJOR}-idempotency_${DEB_VERSION}_$(dpkg --print-architecture).deb"
if ((rc == 0)) && [[ -f $DEB ]]; then
  ok "dpkg-buildpackage builds $(basename "$DEB")"
else
  tail -40 "$BUILD/build.log" | sed 's/^/    | /'
  not_ok "dpkg-buildpackage (exit $rc)"
  echo "${passed} passed, ${failed} failed"
  exit 1
fi
same "README.md's dpkg -i line names the package built" "$(basename "$DEB")" "$(basename "${README_INSTALL##* }")"
dirty="$(cd "$SRC" && git status --porcelain)"
same "dpkg-buildpackage in a clone leaves git status clean (untracked: .gitignore)" "" "$dirty"
PKG="postgresql-${IDEM_PG_MAJOR}-idempotency"
PKGLIB="$("$IDEM_PG_CONFIG" --pkglibdir)"
EXTDIR="$("$IDEM_PG_CONFIG" --sharedir)/extension"
contents="$(dpkg-deb -c "$DEB")"
for f in "$PKGLIB/idempotency.so" "$EXTDIR/idempotency.control" "$EXTDIR/idempotency--$VERSION.sql"; do
  check "the package ships $f" grep -qF ".$f" <<<"$contents"
done

# --- PGXN: the release zip installs with the PGXN client ------------------------------
# A zip like `git archive --format zip --prefix=idempotency-X.Y.Z/`, made from the copy.
ZIP="$BUILD/idempotency-$SEMVER.zip"
(cd "$BUILD" && rm -rf "pgxn/idempotency-$SEMVER" && mkdir -p pgxn &&
  cp -a "$SRC/." "pgxn/idempotency-$SEMVER/" && rm -rf "pgxn/idempotency-$SEMVER/debian" &&
  cd pgxn && /usr/bin/python3 -c 'import shutil,sys; shutil.make_archive(sys.argv[1], "zip", ".", sys.argv[2])' \
    "${ZIP%.zip}" "idempotency-$SEMVER")
# pgxn install runs make and make install; a make wrapper sends the install to a DESTDIR.
printf '#!/bin/sh\nexec make DESTDIR="%s" "$@"\n' "$BUILD/pgxn-root" >"$BUILD/make-destdir"
chmod +x "$BUILD/make-destdir"
(cd "$BUILD" && pgxn install --make "$BUILD/make-destdir" --pg_config "$IDEM_PG_CONFIG" "$ZIP") \
  >"$BUILD/pgxn.log" 2>&1
rc=$?
pgxn_ok=1
for f in "$PKGLIB/idempotency.so" "$EXTDIR/idempotency.control" "$EXTDIR/idempotency--$VERSION.sql"; do
  [[ -f $BUILD/pgxn-root$f ]] || pgxn_ok=0
done
if ((rc == 0 && pgxn_ok)); then
  ok "pgxn install of the release zip builds and installs the extension files"
else
  tail -30 "$BUILD/pgxn.log" | sed 's/^/    | /'
  not_ok "pgxn install of the release zip (exit $rc)"
fi

if ! idem_is_root; then
  echo "# not root: installing the package is skipped"
  echo "${passed} passed, ${failed} failed"
  ((failed == 0))
  exit
fi

# --- install it, use it, put the previous state back -------------------------------------
BACKUP="$BUILD/backup"
mkdir -p "$BACKUP"
pre_installed=0
dpkg-query -W -f='${Status}' "$PKG" 2>/dev/null | grep -q 'install ok installed' && pre_installed=1
cp -p "$PKGLIB"/idempotency.so "$EXTDIR"/idempotency.control "$EXTDIR"/idempotency--*.sql "$BACKUP"/ 2>/dev/null
restored=0
restore() {
  ((restored)) && return 0
  restored=1
  [[ -n ${PGDATA_DIR:-} ]] && cluster_stop "$PGDATA_DIR"
  if ((pre_installed)); then
    echo "# $PKG was installed before this suite: it stays installed (now this tree's build)"
  else
    with_dpkg_lock dpkg -r "$PKG" >"$BUILD/remove.log" 2>&1 || { cat "$BUILD/remove.log"; return 1; }
    local f
    for f in "$BACKUP"/*; do
      [[ -e $f ]] || continue
      case "$(basename "$f")" in
        *.so) cp -p "$f" "$PKGLIB/" ;;
        *) cp -p "$f" "$EXTDIR/" ;;
      esac
    done
  fi
}
trap 'rc=$?; restore; (exit $rc); idem_on_exit' EXIT

# Other builds in this tree wait while the installed files are the package's.
mkdir -p "$IDEM_ROOT/.test-run"
exec 9>"$IDEM_ROOT/.test-run/build.lock"
flock 9
echo "# README.md: $README_INSTALL (in $SRC)"
# shellcheck disable=SC2086  # the README's command line, word for word
if (cd "$SRC" && with_dpkg_lock $README_INSTALL) >"$BUILD/install.log" 2>&1; then
  ok "the README's dpkg -i installs $PKG"
else
  sed 's/^/    | /' "$BUILD/install.log"
  not_ok "dpkg -i $PKG"
fi
owned="$(dpkg -L "$PKG" 2>/dev/null)"
for f in "$PKGLIB/idempotency.so" "$EXTDIR/idempotency.control" "$EXTDIR/idempotency--$VERSION.sql"; do
  check "installed and owned by $PKG: $f" bash -c '[[ -f $1 ]] && grep -qxF "$1" <<<"$2"' _ "$f" "$owned"
done
check "dpkg --verify $PKG: files as packaged" dpkg --verify "$PKG"

PGDATA_DIR="$IDEM_SCRATCH/pg"
cluster_start "$PGDATA_DIR" "$(idem_free_port 5480 5489)" # preloads the packaged library
q() { psql -X -qAt -v ON_ERROR_STOP=1 -d postgres "$@"; }
check "CREATE EXTENSION idempotency with the packaged files" q -c "CREATE EXTENSION idempotency"
same "installed extension version" "$VERSION" "$(q -c "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'")"
same "the extension's objects are in its own schema idempotency" "idempotency" \
  "$(q -c "SELECT extnamespace::regnamespace FROM pg_extension WHERE extname = 'idempotency'")"
same "claim_key, complete_key and the replay work" "claimed,replay,replay,201" \
  "$(q -c "SELECT status FROM idempotency.claim_key('pkg-test')" \
       -c "SELECT status FROM idempotency.complete_key('pkg-test', (SELECT lease_token FROM idempotency.idempotency_keys WHERE key = 'pkg-test'), '{\"ok\": true}', 201)" \
       -c "SELECT status || ',' || response_code FROM idempotency.claim_key('pkg-test')" | paste -sd,)"
same "the preloaded packaged library serves the shared counters" "t" \
  "$(q -c "SELECT bool_and(shared_memory) FROM idempotency.idempotency_stats")"
cluster_stop "$PGDATA_DIR"

restore
if ((pre_installed)); then
  ok "package state kept (it was installed before)"
else
  check "dpkg -r removed $PKG" bash -c "! dpkg-query -W -f='\${Status}' '$PKG' 2>/dev/null | grep -q 'install ok installed'"
  check "the previously installed files are back" \
    bash -c 'for f in "$1"/*; do n=$(basename "$f"); [[ $n == *.so ]] && d=$2 || d=$3; cmp -s "$f" "$d/$n" || exit 1; done' \
    _ "$BACKUP" "$PKGLIB" "$EXTDIR"
fi
flock -u 9

echo "${passed} passed, ${failed} failed"
((failed == 0))
