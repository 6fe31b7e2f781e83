#!/usr/bin/env bash
# The portable edition's installs and what only it has (issue #36), on a server where the C++
# library is neither preloaded nor created:
#   1. psql -f of the generated script by the database owner, who is not a superuser; an
#      application role with USAGE only; per-role keys under row-level security;
#   2. an update in place from the script of version 1.2.0 to the current one, with keys in it,
#      and from 1.3.0 (before the life-cycle functions) with claims open and completed;
#   3. keys dumped from the portable edition restored into the C++ edition and back, answering
#      replay on the other side;
#   4. cleanup by pg_cron (Debian's postgresql-15-cron): the documented cron.schedule block.
# The behaviour suites (pgtap-portable, isolation-portable) are run by test/run.sh.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

build_and_install
idem_scratch_init

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
  fi
}
q() { as_pg psql -X -q -At -v ON_ERROR_STOP=1 "$@" 2>&1; }

GEN="$IDEM_ROOT/portable/tools/generate.sh"
DIR="$IDEM_SCRATCH/portable"
mkdir -p "$DIR"
idem_is_root && chown postgres: "$DIR"
bash "$GEN" psql >"$DIR/current.sql"
bash "$GEN" psql 1.2.0 >"$DIR/v1.2.0.sql"
bash "$GEN" psql 1.3.0 >"$DIR/v1.3.0.sql"
bash "$GEN" psql 1.3.1 >"$DIR/v1.3.1.sql"
bash "$GEN" psql 1.3.2 >"$DIR/v1.3.2.sql"
bash "$GEN" psql 1.3.3 >"$DIR/v1.3.3.sql"
chmod 644 "$DIR"/*.sql

# pg_cron must be preloaded, and names the database its jobs run in. A server built from
# source (the version matrix) may have no pg_cron (Debian's postgresql-NN-cron is for Debian's
# servers): part 4 is skipped there, and says so.
CRON=1
[[ -e $("$IDEM_PG_CONFIG" --pkglibdir)/pg_cron.so ]] || CRON=0
if ((CRON)); then
  cluster_start "$DIR/server" "" "shared_preload_libraries = 'pg_cron'" "cron.database_name = 'shop'" "cron.host = '$DIR/server'" ||
    { echo "0 passed, 1 failed"; exit 1; }
else
  echo "# pg_cron is not installed for $("$IDEM_PG_CONFIG" --version): the cleanup by pg_cron (part 4) is skipped"
  # Nothing preloaded: this edition's server has no C++ library loaded (cluster_start's
  # default preloads it).
  cluster_start "$DIR/server" "" "shared_preload_libraries = ''" || { echo "0 passed, 1 failed"; exit 1; }
fi

q -c "CREATE ROLE shop_owner LOGIN" -c "CREATE ROLE app_a LOGIN" -c "CREATE ROLE app_b LOGIN" \
  -c "CREATE DATABASE shop OWNER shop_owner" >/dev/null

# --- 1. psql -f by the database owner --------------------------------------------------
expect "the installing role is not a superuser" "$(q -d shop -c "SELECT rolsuper FROM pg_roles WHERE rolname = 'shop_owner'")" "f"
out="$(as_pg psql -X -q -v ON_ERROR_STOP=1 -U shop_owner -d shop -f "$DIR/current.sql" 2>&1)"
expect "psql -f by the database owner installs the portable edition" "$?:$out" "0:"
expect "the edition and its version" "$(q -d shop -c "SELECT name || ' ' || version FROM idempotency.edition")" "portable 1.3.4"
expect "the C++ library is not loaded" "$(q -d shop -c "SELECT count(*) FROM pg_extension WHERE extname = 'idempotency'")" "0"
expect "every object belongs to the installing role" \
  "$(q -d shop -c "SELECT count(*) FROM pg_class WHERE relnamespace = 'idempotency'::regnamespace AND relowner <> 'shop_owner'::regrole")" "0"
expect "no SECURITY DEFINER function" \
  "$(q -d shop -c "SELECT count(*) FROM pg_proc WHERE pronamespace = 'idempotency'::regnamespace AND prosecdef")" "0"
expect "every function and table has a COMMENT" \
  "$(q -d shop -c "SELECT count(*) FROM pg_proc p WHERE pronamespace = 'idempotency'::regnamespace AND obj_description(p.oid, 'pg_proc') IS NULL") $(q -d shop -c "SELECT count(*) FROM pg_class c WHERE relnamespace = 'idempotency'::regnamespace AND relkind IN ('r', 'v') AND obj_description(c.oid, 'pg_class') IS NULL")" "0 0"
expect "without USAGE an application role reaches nothing (42501)" \
  "$(q -U app_a -d shop -c "SELECT idempotency.claim_key('k')" | grep -o 'permission denied for schema idempotency')" \
  "permission denied for schema idempotency"
q -U shop_owner -d shop -c "GRANT USAGE ON SCHEMA idempotency TO app_a, app_b" >/dev/null
token_a="$(q -U app_a -d shop -c "SELECT token FROM idempotency.claim_key('order-1', idempotency.request_fingerprint('{\"amount\": 100}'::jsonb))")"
expect "app_a claims" "$(q -U app_a -d shop -c "SELECT status FROM idempotency.complete_key('order-1', '$token_a', '{\"id\": 1}', 201)")" "replay"
expect "app_b: the same key is its own, claimed afresh" "$(q -U app_b -d shop -c "SELECT status FROM idempotency.claim_key('order-1')")" "claimed"
expect "app_b sees only its own rows" "$(q -U app_b -d shop -c "SELECT string_agg(owner, ',') FROM idempotency.idempotency_keys")" "app_b"
expect "app_b cannot write a row in app_a's name (42501)" \
  "$(q -U app_b -d shop -c "INSERT INTO idempotency.idempotency_keys (owner, key, ttl, lease, created_at, expires_at, updated_at) VALUES ('app_a', 'x', '1h', '1h', now(), now() + '1h', now())" | grep -o 'violates row-level security policy')" \
  "violates row-level security policy"
# Direct writes over a bound: every stored value is held to the C++ edition's largest settings
# (the policy's WITH CHECK from 1.3.2), for an insert and an update, and nothing is written.
direct_insert() { # KEY [COLUMN VALUE]
  printf "INSERT INTO idempotency.idempotency_keys (owner, key, ttl, lease, created_at, expires_at, updated_at%s) VALUES ('app_b', %s, '1h', '1h', now(), now() + '1h', now()%s)" \
    "${2:+, $2}" "$1" "${3:+, $3}"
}
for bad in "repeat('k', 1025)||" "''||" "'s'|scope|repeat('s', 1025)" "'f'|fingerprint|decode(repeat('ab', 1025), 'hex')" \
  "'r'|recovery_point|repeat('r', 1048577)" "'a'|attempts|0"; do
  IFS='|' read -r key column value <<<"$bad"
  expect "direct writes over a bound: app_b's insert of ${column:-key} ${value:-$key} is refused (42501)" \
    "$(q -U app_b -d shop -c "$(direct_insert "$key" "$column" "$value")" | grep -o 'violates row-level security policy')" \
    "violates row-level security policy"
done
expect "direct writes over a bound: the largest values are admitted" \
  "$(q -U app_b -d shop -c "$(direct_insert "repeat('k', 1024)" "scope, fingerprint, recovery_point" "repeat('s', 1024), decode(repeat('ab', 1024), 'hex'), repeat('r', 1048576)")")" ""
expect "direct writes over a bound: app_b's update of attempts to 0 is refused (42501)" \
  "$(q -U app_b -d shop -c "UPDATE idempotency.idempotency_keys SET attempts = 0 WHERE key = repeat('k', 1024)" | grep -o 'violates row-level security policy')" \
  "violates row-level security policy"
expect "direct writes over a bound: nothing of the refused writes was stored" \
  "$(q -U app_b -d shop -c "SELECT count(*) || ' ' || min(attempts) FROM idempotency.idempotency_keys WHERE key <> 'order-1'")" "1 1"
q -U app_b -d shop -c "DELETE FROM idempotency.idempotency_keys WHERE key <> 'order-1'" >/dev/null
# complete_key's usual call (the default limit, 1 MiB) lets through at once a response and a body
# of at most half of it each (1.3.3); a larger part is counted exactly, and the sum is what the
# limit holds.
halves="$(q -U app_b -d shop -c "SELECT token FROM idempotency.claim_key('halves')")"
expect "the default limit: a response and a body under it each but over it together are refused (54000)" \
  "$(q -U app_b -d shop -c "SELECT idempotency.complete_key('halves', '$halves', to_jsonb(repeat('x', 600000)), 200, '', convert_to(repeat('b', 600000), 'UTF8'))" | grep -o 'response is too large')" \
  "response is too large"
expect "the default limit: a response over half of it alone is stored" \
  "$(q -U app_b -d shop -c "SELECT status || ' ' || octet_length(response #>> '{}') FROM idempotency.complete_key('halves', '$halves', to_jsonb(repeat('x', 600000)), 200)")" \
  "replay 600000"
q -U app_b -d shop -c "DELETE FROM idempotency.idempotency_keys WHERE key <> 'order-1'" >/dev/null
# The usual calls name the key's owner in each statement (from 1.3.3 as the policy does): the
# installing role, which the policy does not hold, never answers from another role's row, even
# one without a stamp (a row restored from before 1.3.0).
q -U shop_owner -d shop -c "INSERT INTO idempotency.idempotency_keys (owner, key, ttl, lease, created_at, expires_at, updated_at, status, response, response_code, owner_oid, owner_system) VALUES ('app_a', 'unstamped', '1h', '1h', now(), now() + '1h', now(), 'completed', '{\"of\": \"app_a\"}', 200, NULL, NULL)" >/dev/null
expect "the installing role's claim of a key only another role's unstamped row holds: its own, claimed afresh" \
  "$(q -U shop_owner -d shop -c "SELECT status || ' ' || (response IS NULL) FROM idempotency.claim_key('unstamped')")" "claimed true"
expect "and app_a's unstamped row answers app_a" \
  "$(q -U app_a -d shop -c "SELECT status || ' ' || response::text FROM idempotency.claim_key('unstamped')")" 'replay {"of": "app_a"}'
q -U shop_owner -d shop -c "DELETE FROM idempotency.idempotency_keys WHERE key = 'unstamped'" >/dev/null
expect "app_b cannot change app_a's key" \
  "$(q -U app_b -d shop -c "UPDATE idempotency.idempotency_keys SET response = '{}' WHERE owner = 'app_a'; SELECT 'done'")" "done"
expect "and app_a's key kept its response" "$(q -U app_a -d shop -c "SELECT response FROM idempotency.claim_key('order-1', idempotency.request_fingerprint('{\"amount\": 100}'::jsonb))")" '{"id": 1}'
expect "app_b cannot read app_a's lock secret" "$(q -U app_b -d shop -c "SELECT count(*) FROM idempotency.role_secrets WHERE owner = 'app_a'")" "0"
expect "app_b cannot run the cleanup (42501)" \
  "$(q -U app_b -d shop -c "SELECT idempotency.idempotency_cleanup()" | grep -o 'permission denied for function idempotency_cleanup')" \
  "permission denied for function idempotency_cleanup"
expect "app_b cannot truncate the table (42501)" \
  "$(q -U app_b -d shop -c "TRUNCATE idempotency.idempotency_keys" | grep -o 'permission denied')" "permission denied"
# claim_key and complete_key pin no search_path on their usual calls (1.3.2): operators of the
# caller's own schema, first on its path, must not be what they compare with (a key would
# match any key, a token any token).
q -d shop -c "CREATE SCHEMA evil AUTHORIZATION app_a" >/dev/null
q -U app_a -d shop -c "CREATE FUNCTION evil.always(uuid, uuid) RETURNS bool LANGUAGE sql AS 'SELECT true'" \
  -c "CREATE OPERATOR evil.= (LEFTARG = uuid, RIGHTARG = uuid, FUNCTION = evil.always)" \
  -c "CREATE FUNCTION evil.always(text, text) RETURNS bool LANGUAGE sql AS 'SELECT true'" \
  -c "CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.always)" \
  -c "CREATE FUNCTION evil.octet_length(text) RETURNS int LANGUAGE sql AS 'SELECT 1'" >/dev/null
expect "a caller's own operators on its search_path: complete_key still refuses a token never issued (55000)" \
  "$(q -U app_a -d shop -c "SET search_path = evil, pg_catalog" -c "SELECT idempotency.claim_key('evil-path')" -c "SELECT idempotency.complete_key('evil-path', gen_random_uuid(), '{}')" 2>&1 | grep -o 'token does not hold idempotency key')" \
  "token does not hold idempotency key"
expect "a caller's own operators on its search_path: claim_key of a new key still claims it (no other key replayed)" \
  "$(q -U app_a -d shop -c "SET search_path = evil, pg_catalog" -c "SELECT status FROM idempotency.claim_key('evil-new')")" "claimed"
expect "a caller's own functions on its search_path: complete_key still measures the key (22001)" \
  "$(q -U app_a -d shop -c "SET search_path = evil, pg_catalog" -c "SELECT idempotency.complete_key(repeat('k', 300), gen_random_uuid(), '{}')" 2>&1 | grep -o 'idempotency key is too long')" \
  "idempotency key is too long"
q -d shop -c "DROP SCHEMA evil CASCADE" >/dev/null
q -U app_a -d shop -c "DELETE FROM idempotency.idempotency_keys WHERE key IN ('evil-path', 'evil-new')" >/dev/null
expect "a bad setting is refused at the call (22023)" \
  "$(q -U app_a -d shop -c "SET idempotency.default_ttl = '-5'" -c "SELECT idempotency.claim_key('bad-setting')" | grep -o 'invalid value for parameter "idempotency.default_ttl"')" \
  'invalid value for parameter "idempotency.default_ttl"'
expect "gen_uuid_v7 is version 7, increasing, and carries its time" \
  "$(q -d shop -c "SELECT bool_and(substr(u::text, 15, 1) = '7' AND substr(u::text, 20, 1) IN ('8','9','a','b')) AND count(DISTINCT u) = 1000 AND bool_and(idempotency.uuid_v7_time(u) BETWEEN now() - interval '1 min' AND clock_timestamp()) FROM (SELECT idempotency.gen_uuid_v7() u FROM generate_series(1, 1000)) s")
$(q -d shop -c "SELECT bool_and(u > p) FROM (SELECT u, lag(u) OVER (ORDER BY i) p FROM (SELECT i, idempotency.gen_uuid_v7() u FROM generate_series(1, 1000) i) s) t WHERE p IS NOT NULL")" "t
t"

# The SQL walkthrough of examples/README.md, as printed, as the application role of a database
# it owns and where it installed the portable edition itself: what walkthrough.out shows.
q -c "CREATE ROLE app LOGIN" -c "CREATE DATABASE app OWNER app" >/dev/null
as_pg psql -X -q -v ON_ERROR_STOP=1 -U app -d app -f "$DIR/current.sql" >/dev/null 2>&1
cp "$IDEM_ROOT/examples/sql/walkthrough.sql" "$DIR/" && chmod 644 "$DIR/walkthrough.sql"
as_pg psql -X -v ON_ERROR_STOP=1 -U app -d app -f "$DIR/walkthrough.sql" >"$DIR/walkthrough.out" 2>"$DIR/walkthrough.err"
expect "examples/sql/walkthrough.sql prints walkthrough.out on the portable edition" \
  "$?:$(diff "$IDEM_ROOT/examples/sql/walkthrough.out" "$DIR/walkthrough.out" | head -20)" "0:"

# --- 2. update in place from 1.2.0 with keys in it -----------------------------------------
q -c "CREATE DATABASE upd OWNER shop_owner" >/dev/null
out="$(as_pg psql -X -q -v ON_ERROR_STOP=1 -U shop_owner -d upd -f "$DIR/v1.2.0.sql" 2>&1)"
expect "version 1.2.0 installs" "$?:$(q -d upd -c "SELECT version FROM idempotency.edition")" "0:1.2.0"
q -U shop_owner -d upd -c "GRANT USAGE ON SCHEMA idempotency TO app_a" >/dev/null
tok="$(q -U app_a -d upd -c "SELECT token FROM idempotency.claim_key('kept')")"
q -U app_a -d upd -c "SELECT idempotency.complete_key('kept', '$tok', '{\"kept\": true}', 200)" >/dev/null
# A key of a role dropped before the update (no cleanup in between): 1.2 kept no OID, so the
# update deletes it rather than hand it to a later role of the name.
q -c "CREATE ROLE upd_gone LOGIN" >/dev/null
q -U shop_owner -d upd -c "GRANT USAGE ON SCHEMA idempotency TO upd_gone" >/dev/null
q -U upd_gone -d upd -c "SELECT idempotency.claim_key('gone-key')" >/dev/null
q -U shop_owner -d upd -c "REVOKE USAGE ON SCHEMA idempotency FROM upd_gone" >/dev/null
q -c "DROP ROLE upd_gone" >/dev/null
out="$(as_pg psql -X -q -v ON_ERROR_STOP=1 -U shop_owner -d upd -f "$DIR/current.sql" 2>&1)"
expect "the current script updates it in place" "$?:$(q -d upd -c "SELECT version FROM idempotency.edition")" "0:1.3.4"
expect "the key survives the update and replays" "$(q -U app_a -d upd -c "SELECT status || ' ' || response::text FROM idempotency.claim_key('kept')")" 'replay {"kept": true}'
expect "the update stamped the key with its role's OID and this cluster" \
  "$(q -d upd -c "SELECT owner_oid = 'app_a'::regrole AND owner_system = (SELECT system_identifier FROM pg_control_system()) FROM idempotency.idempotency_keys WHERE key = 'kept'")" "t"
expect "the update deleted the key of the dropped role" \
  "$(q -d upd -c "SELECT count(*) FROM idempotency.idempotency_keys WHERE owner = 'upd_gone'")" "0"
expect "the update brought the key counts" "$(q -d upd -c "SELECT completed FROM idempotency_monitor.key_counts")" "1"
out="$(as_pg psql -X -q -v ON_ERROR_STOP=1 -U shop_owner -d upd -f "$DIR/current.sql" 2>&1)"
expect "running the current script again changes nothing" "$?:$(q -d upd -c "SELECT version || ' ' || (SELECT count(*) FROM idempotency.idempotency_keys) FROM idempotency.edition")" "0:1.3.4 1"

# From 1.3.0 (no life-cycle functions yet) with keys in every state: a completed key, a claim
# whose holder completes it after the update (with the token it got before), a released one.
q -c "CREATE DATABASE upd13 OWNER shop_owner" >/dev/null
out="$(as_pg psql -X -q -v ON_ERROR_STOP=1 -U shop_owner -d upd13 -f "$DIR/v1.3.0.sql" 2>&1)"
expect "version 1.3.0 installs" "$?:$(q -d upd13 -c "SELECT version FROM idempotency.edition")" "0:1.3.0"
q -U shop_owner -d upd13 -c "GRANT USAGE ON SCHEMA idempotency TO app_a" >/dev/null
tok="$(q -U app_a -d upd13 -c "SELECT token FROM idempotency.claim_key('done', '\\x01'::bytea)")"
q -U app_a -d upd13 -c "SELECT idempotency.complete_key('done', '$tok', '{\"done\": 1}', 201)" >/dev/null
held="$(q -U app_a -d upd13 -c "SELECT token FROM idempotency.claim_key('held', lease => '1 hour')")"
tok="$(q -U app_a -d upd13 -c "SELECT token FROM idempotency.claim_key('released')")"
q -U app_a -d upd13 -c "SELECT idempotency.release_key('released', '$tok')" >/dev/null
expect "1.3.0 has no look_key" "$(q -U app_a -d upd13 -c "SELECT to_regproc('idempotency.look_key') IS NULL")" "t"
out="$(as_pg psql -X -q -v ON_ERROR_STOP=1 -U shop_owner -d upd13 -f "$DIR/current.sql" 2>&1)"
expect "the current script updates 1.3.0 in place" "$?:$out:$(q -d upd13 -c "SELECT version FROM idempotency.edition")" "0::1.3.4"
expect "after the update: the completed key replays, with response_dropped false" \
  "$(q -U app_a -d upd13 -c "SELECT status || ' ' || response::text || ' ' || response_code || ' ' || response_dropped FROM idempotency.claim_key('done', '\\x01'::bytea)")" \
  'replay {"done": 1} 201 false'
expect "after the update: look_key sees the three keys as claim_key would answer" \
  "$(q -U app_a -d upd13 -c "SELECT string_agg(k || ' ' || (idempotency.look_key(k)).status, ', ' ORDER BY k) FROM unnest(ARRAY['done', 'held', 'released', 'none']) k")" \
  "done replay, held in_progress, none claimed, released reclaimed"
expect "after the update: the stuck-holders view counts the open claim" \
  "$(q -d upd13 -c "SELECT role || ' ' || processing || ' ' || leases_ended FROM idempotency_monitor.stuck_holders")" "app_a 1 0"
expect "after the update: the holder completes with its token of before, with a response_ttl" \
  "$(q -U app_a -d upd13 -c "SELECT status || ' ' || response_dropped FROM idempotency.complete_key('held', '$held', '{\"held\": 1}', response_ttl => '1 min')")" "replay false"
expect "after the update: complete_key has one signature, response_ttl last" \
  "$(q -d upd13 -c "SELECT string_agg(proname || '(' || oidvectortypes(proargtypes) || ')', '; ') FROM pg_proc WHERE pronamespace = 'idempotency'::regnamespace AND proname = 'complete_key'")" \
  "complete_key(text, uuid, jsonb, integer, text, bytea, jsonb, interval)"
expect "after the update: forget_key forgets the released key, and the next claim is claimed" \
  "$(q -U app_a -d upd13 -c "SELECT idempotency.forget_key('released')" -c "SELECT status FROM idempotency.claim_key('released')")" "t
claimed"
out="$(as_pg psql -X -q -v ON_ERROR_STOP=1 -U shop_owner -d upd13 -f "$DIR/current.sql" 2>&1)"
expect "running the current script again on the updated 1.3.0 changes nothing" \
  "$?:$out:$(q -d upd13 -c "SELECT version || ' ' || (SELECT count(*) FROM idempotency.idempotency_keys) FROM idempotency.edition")" "0::1.3.4 3"

# update_with_keys VERSION DB: VERSION installed in a new database DB, a completed key and a
# claim still held made in it, then the current script run over it: it updates in place, the
# completed key replays and the holder completes with its token of before.
update_with_keys() {
  local version="$1" db="$2" out tok held
  q -c "CREATE DATABASE $db OWNER shop_owner" >/dev/null
  out="$(as_pg psql -X -q -v ON_ERROR_STOP=1 -U shop_owner -d "$db" -f "$DIR/v$version.sql" 2>&1)"
  expect "version $version installs" "$?:$(q -d "$db" -c "SELECT version FROM idempotency.edition")" "0:$version"
  q -U shop_owner -d "$db" -c "GRANT USAGE ON SCHEMA idempotency TO app_a" >/dev/null
  tok="$(q -U app_a -d "$db" -c "SELECT token FROM idempotency.claim_key('done', '\\x01'::bytea)")"
  q -U app_a -d "$db" -c "SELECT idempotency.complete_key('done', '$tok', '{\"done\": 1}', 201)" >/dev/null
  held="$(q -U app_a -d "$db" -c "SELECT token FROM idempotency.claim_key('held', lease => '1 hour')")"
  out="$(as_pg psql -X -q -v ON_ERROR_STOP=1 -U shop_owner -d "$db" -f "$DIR/current.sql" 2>&1)"
  expect "the current script updates $version in place" "$?:$out:$(q -d "$db" -c "SELECT version FROM idempotency.edition")" "0::1.3.4"
  expect "after the update from $version: the completed key replays" \
    "$(q -U app_a -d "$db" -c "SELECT status || ' ' || response::text || ' ' || response_code FROM idempotency.claim_key('done', '\\x01'::bytea)")" \
    'replay {"done": 1} 201'
  expect "after the update from $version: the holder completes with its token of before" \
    "$(q -U app_a -d "$db" -c "SELECT status || ' ' || response::text FROM idempotency.complete_key('held', '$held', '{\"held\": 1}')")" 'replay {"held": 1}'
}

# From 1.3.1 (the bounds in a CHECK constraint, the cluster read at every call) with keys in
# place: a completed key, and a claim whose holder completes it after the update.
update_with_keys 1.3.1 upd131
expect "after the update from 1.3.1: the bounds are the policy's, no CHECK constraint is left" \
  "$(q -d upd131 -c "SELECT count(*) FROM pg_constraint WHERE conrelid = 'idempotency.idempotency_keys'::regclass AND contype = 'c'")" "0"
expect "after the update from 1.3.1: a direct write over a bound is refused (42501)" \
  "$(q -U app_a -d upd131 -c "UPDATE idempotency.idempotency_keys SET key = repeat('k', 1025) WHERE key = 'held'" | grep -o 'violates row-level security policy')" \
  "violates row-level security policy"
expect "after the update from 1.3.1: the stamp of a new claim is this cluster's" \
  "$(q -U app_a -d upd131 -c "SELECT idempotency.claim_key('new')" >/dev/null; q -d upd131 -c "SELECT owner_oid = 'app_a'::regrole AND owner_system = (SELECT system_identifier FROM pg_control_system()) FROM idempotency.idempotency_keys WHERE key = 'new'")" "t"

# From 1.3.2 (the policy's ceilings in more function calls, complete_key's answer from a row of
# every column) with keys in place: a completed key, and a claim whose holder completes it
# after the update.
update_with_keys 1.3.2 upd132
for bad in "key = repeat('k', 1025)" "key = ''" "fingerprint = decode(repeat('ab', 1025), 'hex')" "recovery_point = repeat('r', 1048577)"; do
  expect "after the update from 1.3.2: a direct update over a bound is refused (42501): $bad" \
    "$(q -U app_a -d upd132 -c "UPDATE idempotency.idempotency_keys SET $bad WHERE key = 'held'" | grep -o 'violates row-level security policy')" \
    "violates row-level security policy"
done
expect "after the update from 1.3.2: the largest values are admitted (and a NULL fingerprint)" \
  "$(q -U app_a -d upd132 -c "UPDATE idempotency.idempotency_keys SET scope = repeat('s', 1024), fingerprint = NULL, recovery_point = repeat('r', 1048576) WHERE key = 'held'; SELECT 'done'")" "done"

# The expiry index by major (1.3.4): a BRIN over expiry_bucket(expires_at) on 16 and later, where
# a claim's completion is then a HOT update (no new entry in the primary key); the B-Tree on 15.
# expiry_layout DB: the index's access method and key, then the HOT updates of claims
# completed in their own transaction (app_a: three keys, deleted again).
expiry_layout() {
  q -d "$1" -c "SET search_path = pg_catalog" -c "SELECT a.amname || ' ' || pg_get_indexdef(i.oid, 1, true) FROM pg_class i JOIN pg_am a ON a.oid = i.relam
                 WHERE i.oid = 'idempotency.idempotency_keys_expires_at_idx'::regclass"
  q -U app_a -d "$1" -c "SELECT count(*) FROM (
      SELECT idempotency.complete_key(k, (idempotency.claim_key(k)).token, '{}') FROM
        (VALUES ('hot-1'), ('hot-2'), ('hot-3')) v(k)) c;
    SELECT n_tup_hot_upd || '/' || n_tup_upd FROM pg_stat_xact_user_tables WHERE relid = 'idempotency.idempotency_keys'::regclass" | tail -1
  q -U app_a -d "$1" -c "DELETE FROM idempotency.idempotency_keys WHERE key LIKE 'hot-_'" >/dev/null
}
if ((IDEM_PG_MAJOR >= 16)); then
  layout="brin idempotency.expiry_bucket(expires_at)
3/3"
else
  layout="btree expires_at
0/3"
fi
expect "the expiry index of this major, and the completions' HOT updates (PostgreSQL $IDEM_PG_MAJOR)" "$(expiry_layout shop)" "$layout"
expect "expiry_bucket: the minute, never later; infinity stays; NULL stays" \
  "$(q -d shop -c "SELECT idempotency.expiry_bucket('2026-12-05 15:49:31.5+00') = '2026-12-05 15:49:00+00',
                          idempotency.expiry_bucket('1999-12-31 23:59:59.999999+00') = '1999-12-31 23:59:00+00',
                          idempotency.expiry_bucket('infinity'), idempotency.expiry_bucket(NULL) IS NULL")" "t|t|infinity|t"

# From 1.3.3 (the B-Tree on every major) with keys in place: the index is rebuilt as this major's.
update_with_keys 1.3.3 upd133
expect "after the update from 1.3.3: the expiry index of this major, and the completions' HOT updates" \
  "$(expiry_layout upd133)" "$layout"

# --- 3. keys move between the editions -------------------------------------------------
q -c "CREATE DATABASE cpp" -c "CREATE DATABASE back OWNER shop_owner" >/dev/null
q -d cpp -c "CREATE EXTENSION idempotency" -c "GRANT USAGE ON SCHEMA idempotency TO app_a" >/dev/null
as_pg pg_dump -h "$PGHOST" -p "$PGPORT" -U postgres -d shop --data-only -t idempotency.idempotency_keys -f "$DIR/keys.sql"
q -d cpp -f "$DIR/keys.sql" >/dev/null
expect "the portable dump carries the stamp columns" \
  "$(grep -c '^COPY idempotency.idempotency_keys (.*owner_oid, owner_system, response_expires_at) FROM stdin;' "$DIR/keys.sql")" "1"
expect "portable -> C++: the rows keep their stamp (same cluster: app_a's OID)" \
  "$(q -d cpp -c "SELECT count(*) FILTER (WHERE owner_oid = owner::regrole AND owner_system = (SELECT system_identifier FROM pg_control_system())) || ' ' || count(*) FROM idempotency.idempotency_keys")" \
  "$(q -d shop -c "SELECT count(*) || ' ' || count(*) FROM idempotency.idempotency_keys")"
expect "portable -> C++: app_a's key answers replay there" \
  "$(q -U app_a -d cpp -c "SELECT status || ' ' || response::text || ' ' || response_code FROM idempotency.claim_key('order-1', idempotency.request_fingerprint('{\"amount\": 100}'::jsonb))")" \
  'replay {"id": 1} 201'
tok="$(q -U app_a -d cpp -c "SELECT token FROM idempotency.claim_key('from-cpp')")"
q -U app_a -d cpp -c "SELECT idempotency.complete_key('from-cpp', '$tok', '{\"cpp\": 1}', 200, response_body => '\\x00ff', response_headers => '{\"X-A\": \"1\"}')" >/dev/null
as_pg psql -X -q -v ON_ERROR_STOP=1 -U shop_owner -d back -f "$DIR/current.sql" >/dev/null 2>&1
q -U shop_owner -d back -c "GRANT USAGE ON SCHEMA idempotency TO app_a" >/dev/null
as_pg pg_dump -h "$PGHOST" -p "$PGPORT" -U postgres -d cpp --data-only -t idempotency.idempotency_keys -f "$DIR/keys-cpp.sql"
q -d back -f "$DIR/keys-cpp.sql" >/dev/null
expect "the C++ dump carries the stamp columns" \
  "$(grep -c '^COPY idempotency.idempotency_keys (.*owner_oid, owner_system, response_expires_at) FROM stdin;' "$DIR/keys-cpp.sql")" "1"
expect "C++ -> portable: the row keeps its stamp" \
  "$(q -d back -c "SELECT owner_oid = 'app_a'::regrole AND owner_system = (SELECT system_identifier FROM pg_control_system()) FROM idempotency.idempotency_keys WHERE key = 'from-cpp'")" "t"
expect "C++ -> portable: the key answers replay as sent" \
  "$(q -U app_a -d back -c "SELECT status || ' ' || response::text || ' ' || encode(response_body, 'hex') || ' ' || response_headers::text FROM idempotency.claim_key('from-cpp')")" \
  'replay {"cpp": 1} 00ff {"X-A": "1"}'
# A row from another cluster (its stamp names another system) is adopted by name there, and
# one stamped here by an earlier role of the name is absent: the same rule in both editions.
for db in cpp back; do
  q -d "$db" -c "UPDATE idempotency.idempotency_keys SET owner_system = 42 WHERE key = 'order-1'" \
    -c "UPDATE idempotency.idempotency_keys SET owner_oid = 4242 WHERE key = 'from-cpp'" >/dev/null
  expect "$db: a row stamped by another cluster answers the role of its name" \
    "$(q -U app_a -d "$db" -c "SELECT status FROM idempotency.claim_key('order-1', idempotency.request_fingerprint('{\"amount\": 100}'::jsonb))")" "replay"
  expect "$db: a row stamped here under another OID is absent for the role of its name" \
    "$(q -U app_a -d "$db" -c "SELECT status FROM idempotency.claim_key('from-cpp')")" "claimed"
done
expect "the same fingerprint in both editions" \
  "$(q -d cpp -c "SELECT encode(idempotency.request_fingerprint('{\"b\": [1, \"x\", null, true], \"a\": 1.50}'::jsonb), 'hex')")" \
  "$(q -d shop -c "SELECT encode(idempotency.request_fingerprint('{\"a\": 1.5, \"b\": [1, \"x\", null, true]}'::jsonb), 'hex')")"

# request_fingerprint(jsonb) builds its stream with a stack (it names nothing in the schema, for
# roles without USAGE); it must hash exactly the recursive reference stream.
expect "request_fingerprint(jsonb) hashes the reference stream (fingerprint_stream)" \
  "$(q -d shop -c "SELECT count(*) FILTER (WHERE idempotency.request_fingerprint(v) <> sha256(idempotency.fingerprint_stream(v, true))) || ' ' || count(*) FROM (VALUES ('null'::jsonb), ('true'), ('false'), ('1.50'), ('\"x\"'), ('{}'), ('[]'), ('[[], {}, [[]]]'), ('{\"b\": [1, \"x\", null, true], \"a\": 1.50}'), ('{\"z\": {\"y\": {\"x\": [1, {\"w\": \"\u00e9\"}]}}, \"\": 0}'), ('[1, [2, [3, [4]]], {\"k\": [false, -0.0, 1e3]}]')) t(v)")" "0 11"

# --- 4. cleanup by pg_cron (the block of portable/README.md) ---------------------------------
if ((CRON)); then
  q -d shop -c "CREATE EXTENSION pg_cron" -c "GRANT USAGE ON SCHEMA cron TO shop_owner" >/dev/null
  q -U app_a -d shop -c "SELECT idempotency.claim_key('expiring', ttl => '1 second', lease => '1 second')" >/dev/null
  q -U shop_owner -d shop -c "SELECT cron.schedule('idempotency-cleanup', '* * * * *', 'CALL idempotency.cleanup_in_batches()')" >/dev/null
  # pg_cron 1.4 runs a job at the start of a minute: wait for its first run (at most 130 s).
  ran=""
  for _ in $(seq 1 130); do
    ran="$(q -d shop -c "SELECT status FROM cron.job_run_details ORDER BY runid DESC LIMIT 1")"
    [[ $ran == succeeded || $ran == failed ]] && break
    sleep 1
  done
  expect "the cron job ran as the installing role and succeeded" "$ran" "succeeded"
  expect "it deleted the expired key and kept the live ones" \
    "$(q -d shop -c "SELECT count(*) FILTER (WHERE key = 'expiring') || ' ' || count(*) FROM idempotency.idempotency_keys")" "0 2"
  q -d shop -c "SELECT cron.unschedule('idempotency-cleanup')" >/dev/null
fi

cluster_stop "$DIR/server"
echo "$PASSED passed, $FAILED failed"
((FAILED == 0))
