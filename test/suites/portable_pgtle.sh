#!/usr/bin/env bash
# The portable edition installed as a pg_tle extension (issue #36), as on Amazon RDS, Aurora
# or Supabase: on a server with shared_preload_libraries = 'pg_tle', a role that is not a
# superuser, only a member of pgtle_admin, registers the versions with the generated
# dist/idempotency-pgtle.sql of the previous version, runs CREATE EXTENSION idempotency, an
# application role puts keys in, then the installer registers the current version's update
# path and runs ALTER EXTENSION idempotency UPDATE: the keys still answer replay (and a claim
# left open is still held by its token). A second database is created at the first version
# and updated through every path.
#
# pg_tle refuses to register an extension whose name has a control file in the server's
# share directory, and `make install` puts the C++ edition's idempotency.control there: the
# server runs from a copy of the installation without the C++ edition's files (the binaries
# copied, since PostgreSQL finds its share and library directories from its own path; the
# rest linked). Runs when pg_tle is installed for the server under test (CONTRIBUTING.md says
# how to build it); otherwise it says so and counts nothing. Ends with "N passed, N failed".
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

build_and_install
idem_scratch_init

pkglibdir="$("$IDEM_PG_CONFIG" --pkglibdir)"
sharedir="$("$IDEM_PG_CONFIG" --sharedir)"
bindir="$("$IDEM_PG_CONFIG" --bindir)"
if [[ ! -f $pkglibdir/pg_tle.so || ! -f $sharedir/extension/pg_tle.control ]]; then
  echo "# skipped: pg_tle is not installed for $("$IDEM_PG_CONFIG" --version)"
  echo "0 passed, 0 failed"
  exit 0
fi

PASSED=0
FAILED=0
expect() { # NAME GOT WANTED
  if [[ $2 == "$3" ]]; then
    echo "ok - $1"
    PASSED=$((PASSED + 1))
  else
    echo "not ok - $1"
    echo "    got '$2', expected '$3'"
    FAILED=$((FAILED + 1))
    return 1
  fi
}
q() { as_pg psql -X -q -At -v ON_ERROR_STOP=1 "$@" 2>&1; }

GEN="$IDEM_ROOT/portable/tools/generate.sh"
DIR="$IDEM_SCRATCH/pgtle"
mkdir -p "$DIR"
# The version before the current one: registered first, then updated from.
mapfile -t versions < <(sed -nE 's/^VERSIONS=\((.*)\)$/\1/p' "$GEN" | tr ' ' '\n')
current="${versions[-1]}"
previous="${versions[-2]}"
first="${versions[0]}"
bash "$GEN" pgtle "$previous" >"$DIR/previous-pgtle.sql"
bash "$GEN" pgtle >"$DIR/current-pgtle.sql"

# The copy of the installation, at the same paths under $DIR/install (so that the server's
# relative paths from its binaries to share/ and lib/ are the installation's).
copy="$DIR/install"
mkdir -p "$copy$bindir" "$copy$sharedir/extension" "$(dirname "$copy$pkglibdir")"
cp -p "$bindir/postgres" "$bindir/initdb" "$bindir/pg_ctl" "$copy$bindir/"
for f in "$sharedir"/*; do
  [[ $(basename "$f") == extension ]] || ln -s "$f" "$copy$sharedir/"
done
for f in "$sharedir"/extension/*; do
  case "$(basename "$f")" in
  idempotency.control | idempotency--*) ;;
  *) ln -s "$f" "$copy$sharedir/extension/" ;;
  esac
done
ln -s "$pkglibdir" "$copy$pkglibdir"
idem_is_root && chown -R postgres: "$DIR"
chmod -R a+rX "$DIR"
export PATH="$copy$bindir:$PATH"

cluster_start "$DIR/server" "" "shared_preload_libraries = 'pg_tle'" ||
  { echo "0 passed, 1 failed"; exit 1; }

expect "the server runs from the copy without the C++ edition's control file" \
  "$(q -c "SELECT count(*) FILTER (WHERE name = 'idempotency') || ' ' || count(*) FILTER (WHERE name = 'pg_tle') FROM pg_available_extensions")" "0 1"

q -c "CREATE ROLE tle_admin LOGIN" -c "CREATE ROLE app LOGIN" -c "CREATE DATABASE shop OWNER tle_admin" \
  -c "CREATE DATABASE chain OWNER tle_admin" >/dev/null
for db in shop chain; do
  q -d "$db" -c "CREATE EXTENSION pg_tle" >/dev/null
done
q -c "GRANT pgtle_admin TO tle_admin" >/dev/null
expect "the installing role is not a superuser" "$(q -c "SELECT rolsuper FROM pg_roles WHERE rolname = 'tle_admin'")" "f"

# --- the previous version registered and created by the pgtle_admin member ----------------
out="$(as_pg psql -X -q -v ON_ERROR_STOP=1 -U tle_admin -d shop -f "$DIR/previous-pgtle.sql" 2>&1)"
expect "dist/idempotency-pgtle.sql of $previous registers by a member of pgtle_admin" "$?" "0" || printf '    %s\n' "$out" | tail -5
expect "pg_tle lists the versions up to $previous, $previous the default" \
  "$(q -d shop -c "SELECT string_agg(version, ' ' ORDER BY version) FROM pgtle.available_extension_versions() WHERE name = 'idempotency'") $(q -d shop -c "SELECT default_version FROM pgtle.available_extensions() WHERE name = 'idempotency'")" \
  "${versions[*]:0:${#versions[@]}-1} $previous"
expect "CREATE EXTENSION idempotency by the same role" \
  "$(q -U tle_admin -d shop -c "CREATE EXTENSION idempotency" -c "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'")" "$previous"
expect "the edition table says the same version" "$(q -d shop -c "SELECT version FROM idempotency.edition")" "$previous"
expect "every object belongs to the installing role" \
  "$(q -d shop -c "SELECT count(*) FROM pg_class WHERE relnamespace = 'idempotency'::regnamespace AND relowner <> 'tle_admin'::regrole") $(q -d shop -c "SELECT count(*) FROM pg_proc WHERE pronamespace = 'idempotency'::regnamespace AND proowner <> 'tle_admin'::regrole")" "0 0"
expect "no SECURITY DEFINER function" \
  "$(q -d shop -c "SELECT count(*) FROM pg_proc WHERE pronamespace = 'idempotency'::regnamespace AND prosecdef")" "0"

# --- keys of an application role ---------------------------------------------------------
q -U tle_admin -d shop -c "GRANT USAGE ON SCHEMA idempotency TO app" >/dev/null
fp="idempotency.request_fingerprint('{\"amount\": 100}'::jsonb)"
tok_done="$(q -U app -d shop -c "SELECT token FROM idempotency.claim_key('order-1', $fp)")"
expect "app completes a key" \
  "$(q -U app -d shop -c "SELECT status FROM idempotency.complete_key('order-1', '$tok_done', '{\"id\": 1}', 201)")" "replay"
tok_open="$(q -U app -d shop -c "SELECT token FROM idempotency.claim_key('order-2', lease => '1 hour')")"
expect "app holds another key, open" "$(q -U app -d shop -c "SELECT status FROM idempotency.claim_key('order-2')")" "in_progress"

# --- the update path of the current version, then ALTER EXTENSION UPDATE -----------------
out="$(as_pg psql -X -q -v ON_ERROR_STOP=1 -U tle_admin -d shop -f "$DIR/current-pgtle.sql" 2>&1)"
expect "dist/idempotency-pgtle.sql of $current adds its update path (the registered versions kept)" "$?" "0" || printf '    %s\n' "$out" | tail -5
expect "pg_tle has the path $previous -> $current, $current the default" \
  "$(q -d shop -c "SELECT count(*) FROM pgtle.extension_update_paths('idempotency') WHERE source = '$previous' AND target = '$current' AND path IS NOT NULL") $(q -d shop -c "SELECT default_version FROM pgtle.available_extensions() WHERE name = 'idempotency'")" \
  "1 $current"
expect "ALTER EXTENSION idempotency UPDATE by the pgtle_admin member" \
  "$(q -U tle_admin -d shop -c "ALTER EXTENSION idempotency UPDATE" -c "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'")" "$current"
expect "the edition table says $current" "$(q -d shop -c "SELECT version FROM idempotency.edition")" "$current"
expect "the completed key still answers replay with its response" \
  "$(q -U app -d shop -c "SELECT status || ' ' || response::text || ' ' || response_code FROM idempotency.claim_key('order-1', $fp)")" \
  'replay {"id": 1} 201'
expect "the same key with another request: mismatch" \
  "$(q -U app -d shop -c "SELECT status FROM idempotency.claim_key('order-1', idempotency.request_fingerprint('{\"amount\": 5}'::jsonb))")" "mismatch"
expect "the open key is still held" "$(q -U app -d shop -c "SELECT status FROM idempotency.claim_key('order-2')")" "in_progress"
expect "and its holder completes it with the token of before the update" \
  "$(q -U app -d shop -c "SELECT status FROM idempotency.complete_key('order-2', '$tok_open', '{\"id\": 2}', 200)")" "replay"
expect "a new key after the update" "$(q -U app -d shop -c "SELECT status FROM idempotency.claim_key('order-3')")" "claimed"
expect "another role's key stays its own" "$(q -U tle_admin -d shop -c "GRANT USAGE ON SCHEMA idempotency TO tle_admin" -c "SELECT status FROM idempotency.claim_key('order-1')")" "claimed"
expect "no SECURITY DEFINER function after the update" \
  "$(q -d shop -c "SELECT count(*) FROM pg_proc WHERE pronamespace = 'idempotency'::regnamespace AND prosecdef")" "0"
expect "every function of the update is a member of the extension" \
  "$(q -d shop -c "SELECT count(*) FROM pg_proc p WHERE pronamespace = 'idempotency'::regnamespace AND NOT EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e')")" "0"

# --- created at the first version, updated through every path ------------------------------
out="$(as_pg psql -X -q -v ON_ERROR_STOP=1 -U tle_admin -d chain -f "$DIR/current-pgtle.sql" 2>&1)"
expect "the current script registers every version in a fresh database" "$?" "0" || printf '    %s\n' "$out" | tail -5
q -U tle_admin -d chain -c "CREATE EXTENSION idempotency VERSION '$first'" -c "GRANT USAGE ON SCHEMA idempotency TO app" >/dev/null
tok="$(q -U app -d chain -c "SELECT token FROM idempotency.claim_key('kept')")"
q -U app -d chain -c "SELECT idempotency.complete_key('kept', '$tok', '{\"kept\": true}', 200)" >/dev/null
expect "ALTER EXTENSION UPDATE from $first to $current" \
  "$(q -U tle_admin -d chain -c "ALTER EXTENSION idempotency UPDATE" -c "SELECT extversion || ' ' || (SELECT version FROM idempotency.edition) FROM pg_extension WHERE extname = 'idempotency'")" \
  "$current $current"
expect "the key of $first answers replay" \
  "$(q -U app -d chain -c "SELECT status || ' ' || response::text FROM idempotency.claim_key('kept')")" 'replay {"kept": true}'

cluster_stop "$DIR/server"
echo "$PASSED passed, $FAILED failed"
((FAILED == 0))
