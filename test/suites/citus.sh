#!/usr/bin/env bash
# Suite: the extension on a Citus 13 cluster (a coordinator and two workers on this machine,
# ports 5481-5483; the chaos run 5484-5486): the recipe of test/citus/setup.sql, then the claim protocol through the
# coordinator (statuses, in_progress for an open transaction, waiting, fencing, per-role
# keys, NULL keys; look_key and forget_key in test/citus/look_and_forget.py), and the cleanup worker of each node deleting expired keys from its own
# shards (test/citus/check.py), batches through the coordinator; then the chaos harness
# against its own cluster (consumer kills, a worker and the coordinator crashed; a sabotaged
# consumer must be caught); then shard moves and the rebalancer with three roles' keys in every
# state (test/citus/shard_move.py, ports 5484-5488); then ALTER EXTENSION UPDATE from 1.0 on a
# cluster of its own (ports 5487-5489). Runs when Citus is installed for the server under test
# (CONTRIBUTING.md says how to build it); otherwise it says so and counts nothing.
# Ends with "N passed, N failed".
set -uo pipefail
source "$(dirname "$0")/../lib.sh"
ensure_packages
build_and_install
idem_scratch_init

if [[ ! -f "$("$IDEM_PG_CONFIG" --pkglibdir)/citus.so" ]]; then
  echo "# Citus is not installed for $("$IDEM_PG_CONFIG" --version): nothing to run"
  echo "0 passed, 0 failed"
  exit 0
fi

# citus_node PORT: a server in $IDEM_SCRATCH/${CITUS_DIR:-citus}-PORT with Citus created
# ($CITUS_CONF: more configuration lines, one a line).
citus_node() {
  local dir="$IDEM_SCRATCH/${CITUS_DIR:-citus}-$1"
  cluster_start "$dir" "$1" \
    "listen_addresses = '127.0.0.1'" \
    "shared_preload_libraries = 'citus,idempotency'" \
    "idempotency.cleanup_interval = '1s'" \
    "max_prepared_transactions = 20" ${CITUS_CONF:+"$CITUS_CONF"} >/dev/null || return 1
  pg_psql -h "$dir" -p "$1" -c 'CREATE EXTENSION citus' >/dev/null
}

# citus_cluster COORDINATOR_PORT WORKER_PORT WORKER_PORT: three servers, Citus created on each,
# the workers added to the coordinator.
citus_cluster() {
  local port
  for port in "$@"; do
    citus_node "$port" || return 1
  done
  pg_psql -h 127.0.0.1 -p "$1" -c "SELECT citus_set_coordinator_host('127.0.0.1', $1)" \
    -c "SELECT citus_add_node('127.0.0.1', $2)" -c "SELECT citus_add_node('127.0.0.1', $3)" >/dev/null
}

ports=(5481 5482 5483)
dsns=()
for port in "${ports[@]}"; do dsns+=("host=127.0.0.1 port=$port user=postgres dbname=postgres"); done
citus_cluster "${ports[@]}" || { echo "0 passed, 1 failed"; exit 1; }
coordinator=(-h 127.0.0.1 -p "${ports[0]}")
pg_psql "${coordinator[@]}" -f "$IDEM_SRC/test/citus/setup.sql" >/dev/null || exit 1
pg_psql "${coordinator[@]}" -c 'CREATE ROLE citus_app LOGIN' -c 'CREATE ROLE citus_other LOGIN' \
  -c 'GRANT USAGE ON SCHEMA idempotency TO citus_app, citus_other' >/dev/null || exit 1

PASSED=0
FAILED=0

/usr/bin/python3 "$IDEM_SRC/test/citus/check.py" "${dsns[@]}" 2>&1 | tee "$IDEM_SCRATCH/check.log" | grep -v -E '^[0-9]+ passed'
idem_count_run "$IDEM_SCRATCH/check.log"
# look_key and forget_key (1.3), delegated by the recipe: on Citus the look reads the row's xmax
# and the node's key lock through the executor (test/citus/look_and_forget.py).
echo "## look_and_forget.py: look_key and forget_key through the coordinator"
/usr/bin/python3 "$IDEM_SRC/test/citus/look_and_forget.py" "${dsns[@]}" 2>&1 |
  tee "$IDEM_SCRATCH/look_and_forget.log" | grep -v -E '^[0-9]+ passed'
idem_count_run "$IDEM_SCRATCH/look_and_forget.log"
# Citus' own transient owner of a shard move's subscription (created as a superuser member of
# the extension owner, then NOSUPERUSER, no password) does not make calls refuse with 42501;
# the same role with a password, or one whose name is not Citus', still does. The roles
# propagate to every node, so the delegated call meets them on the key's node, as a call meets
# Citus' own role on a move's target node.
transient_claim() { # SQL...: the answer of a claim by citus_app after the statements SQL
  local -a statements=()
  local sql
  for sql in "$@"; do statements+=(-c "$sql"); done
  pg_psql "${coordinator[@]}" "${statements[@]}" >/dev/null 2>&1
  pg_psql "${coordinator[@]}" -At -U citus_app -c "SELECT status FROM idempotency.claim_key('transient-' || gen_random_uuid())" 2>&1 |
    sed -n 's/^\(claimed\)$/\1/p; s/.*ERROR:  \(.*\)/\1/p' | head -1
}
transient_expect() { # NAME EXPECTED GOT
  if [[ $3 == "$2"* ]]; then
    echo "ok - $1"
    PASSED=$((PASSED + 1))
  else
    echo "not ok - $1 (expected '$2', got '$3')"
    FAILED=$((FAILED + 1))
  fi
}
role=citus_shard_move_subscription_role_10_20_30
transient_expect "Citus' transient subscription role (member of the owner, no password): calls answer" claimed \
  "$(transient_claim "CREATE USER $role SUPERUSER IN ROLE postgres" "ALTER ROLE $role NOSUPERUSER")"
transient_expect "the same role given a password: calls refuse (42501, naming it)" \
  "role \"$role\", which is not a superuser, may create objects" "$(transient_claim "ALTER ROLE $role PASSWORD 'x'")"
transient_expect "the same role, password removed, that a role which is not a superuser may grant: calls refuse" \
  "role \"$role\", which is not a superuser, may create objects" \
  "$(transient_claim "ALTER ROLE $role PASSWORD NULL" "CREATE ROLE citus_admin_of_transient" \
    "GRANT $role TO citus_admin_of_transient WITH ADMIN OPTION")"
transient_expect "a member of the owner without a password whose name is not Citus': calls refuse" \
  "role \"not_citus_subscription_role\", which is not a superuser, may create objects" \
  "$(transient_claim "DROP ROLE citus_admin_of_transient" "DROP ROLE $role" \
    "CREATE USER not_citus_subscription_role IN ROLE postgres")"
transient_expect "after those roles are gone: calls answer" claimed "$(transient_claim "DROP ROLE not_citus_subscription_role")"

# No node crashed.
crashed=0
for port in "${ports[@]}"; do
  grep -q 'terminated by signal' "$IDEM_SCRATCH/citus-$port/server.log" && crashed=1
done
if ((crashed)); then
  echo "not ok - a node of the cluster crashed (server.log)"
  FAILED=$((FAILED + 1))
fi

# The chaos harness against its own coordinator + 2 workers (ports 5484-5486): consumer
# kills, a worker and the coordinator crashed (test/chaos/chaos.py --citus).
chaos() { # NAME ARGS...
  local dir="$IDEM_SCRATCH/$1"
  shift
  mkdir -p "$dir"
  /usr/bin/python3 "$IDEM_SRC/test/chaos/chaos.py" run --workdir "$dir" --port 5484 --citus "$@" >"$dir.log" 2>&1
}
echo "## chaos.py run --citus --patterns inbox,2pc,batch --messages 300 --crashes 2"
chaos chaos-citus --patterns inbox,2pc,batch --batch-kill-rate 0.3 --messages 300 --consumers 8 --crashes 2 --timeout 120
grep -v '^ok - ' "$IDEM_SCRATCH/chaos-citus.log" | grep -v -E '^[0-9]+ passed'
grep '^ok - ' "$IDEM_SCRATCH/chaos-citus.log"
idem_count_run "$IDEM_SCRATCH/chaos-citus.log"
# Self-test: on Citus too, the harness catches a consumer that applies an effect on replay.
chaos sabotage-citus --messages 80 --kill-rate 0.2 --crashes 0 --tampered 0 --sabotage debit-on-replay
idem_count_caught "$IDEM_SCRATCH/sabotage-citus.log" "inbox: every account's debit" debit-on-replay

# Shard moves and the rebalancer with three roles' keys in every state (test/citus/shard_move.py):
# a cluster of its own (ports 5484-5486, free once the chaos runs end) and two nodes it adds
# (5487, 5488), with logical WAL for citus_move_shard_placement and no cleanup worker (expired
# rows move with their shards, and no cleanup round is in their way when they are claimed);
# stopped before the next cluster.
move_ports=(5484 5485 5486 5487 5488)
export CITUS_DIR=move CITUS_CONF=$'wal_level = logical\nidempotency.cleanup_worker = off'
if citus_cluster "${move_ports[@]:0:3}" && citus_node "${move_ports[3]}" && citus_node "${move_ports[4]}" &&
  pg_psql -h 127.0.0.1 -p "${move_ports[0]}" -f "$IDEM_SRC/test/citus/setup.sql" >/dev/null; then
  echo "## shard_move.py: citus_move_shard_placement and citus_rebalance_start with three roles' keys"
  /usr/bin/python3 "$IDEM_SRC/test/citus/shard_move.py" "${move_ports[@]}" 2>&1 |
    tee "$IDEM_SCRATCH/shard_move.log" | grep -v -E '^[0-9]+ passed'
  idem_count_run "$IDEM_SCRATCH/shard_move.log"
  for port in "${move_ports[@]}"; do
    if grep -q 'terminated by signal' "$IDEM_SCRATCH/move-$port/server.log"; then
      echo "not ok - a node of the shard-move cluster crashed (move-$port/server.log)"
      FAILED=$((FAILED + 1))
    fi
  done
else
  echo "not ok - the shard-move cluster did not start"
  FAILED=$((FAILED + 1))
fi
for port in "${move_ports[@]}"; do cluster_stop "$IDEM_SCRATCH/move-$port"; done
unset CITUS_DIR CITUS_CONF

# Consumers of two roles keep answering while every kind of Citus operation runs under them
# (test/citus/moves_under_load.py): logical and block_writes moves, the rebalancer onto an added
# node, a drain, a worker crashed and restarted; 0 double, 0 lost, every owner right, and every
# error of a class a client retries (counted by SQLSTATE). Its own cluster on 5484-5486, with
# the spare nodes 5487 and 5488.
export PG_CTL="$IDEM_PG_BIN/pg_ctl"
export CITUS_DIR=load CITUS_CONF=$'wal_level = logical\nidempotency.cleanup_interval = \'1s\''
if citus_cluster 5484 5485 5486 && citus_node 5487 && citus_node 5488 &&
  pg_psql -h 127.0.0.1 -p 5484 -f "$IDEM_SRC/test/citus/setup.sql" >/dev/null; then
  echo "## moves_under_load.py: moves, a rebalance, a drain and a crashed worker under consumers"
  /usr/bin/python3 "$IDEM_SRC/test/citus/moves_under_load.py" 5484 5485 5486 5487 5488 \
    "$IDEM_SCRATCH/load-{port}/data" 2>&1 | tee "$IDEM_SCRATCH/moves_under_load.log" | grep -v -E '^[0-9]+ passed'
  idem_count_run "$IDEM_SCRATCH/moves_under_load.log"
else
  echo "not ok - the cluster of moves_under_load.py did not start"
  FAILED=$((FAILED + 1))
fi
for port in 5484 5485 5486 5487 5488; do cluster_stop "$IDEM_SCRATCH/load-$port"; done

# Two-phase commit recovery, forced at a statement (test/citus/two_phase_recovery.py): the
# coordinator reaches one worker through the script's relay, which cuts the connection at
# COMMIT PREPARED; the worker crashes; recover_prepared_transactions() lands the key and the
# effect together. Nodes talk without TLS so that the relay sees the statements; no automatic
# recovery, so that the script decides when it runs.
export CITUS_DIR=twophase CITUS_CONF=$'citus.node_conninfo = \'sslmode=disable\'\ncitus.recover_2pc_interval = -1'
if citus_node 5484 && citus_node 5485 && citus_node 5486; then
  echo "## two_phase_recovery.py: a worker lost between PREPARE and COMMIT PREPARED"
  /usr/bin/python3 "$IDEM_SRC/test/citus/two_phase_recovery.py" 5484 5485 5486 5487 \
    "$IDEM_SCRATCH/twophase-{port}/data" 2>&1 | tee "$IDEM_SCRATCH/two_phase_recovery.log" | grep -v -E '^[0-9]+ passed'
  idem_count_run "$IDEM_SCRATCH/two_phase_recovery.log"
else
  echo "not ok - the cluster of two_phase_recovery.py did not start"
  FAILED=$((FAILED + 1))
fi
for port in 5484 5485 5486; do cluster_stop "$IDEM_SCRATCH/twophase-$port"; done
unset CITUS_DIR CITUS_CONF

# ALTER EXTENSION UPDATE from 1.0 on a cluster whose key table is distributed: 1.1 and 1.2
# rebuild the primary key, and 1.2 turns the owner's OID into the role's name, which Citus must
# carry to every shard (its own cluster, ports 5487-5489). The 1.3 library refuses the 1.0 table
# until then (55000, also through Citus' executor path), so the 1.0 keys are written by hand, as
# 1.0 stored them: owner a regrole, which each shard holds as its own node's OID of the role.
upgrade=(-h 127.0.0.1 -p 5487)
refused="the cluster did not start"
if citus_cluster 5487 5488 5489 &&
  pg_psql "${upgrade[@]}" -c "CREATE EXTENSION idempotency VERSION '1.0'" \
    -c "SELECT create_distributed_table('idempotency.idempotency_keys', 'key')" \
    -c "SELECT create_distributed_function('idempotency.claim_key(text,bytea,text,interval,interval,interval)', '\$1',
          colocate_with := 'idempotency.idempotency_keys', force_delegation := true)" \
    -c 'CREATE ROLE citus_gone' >/dev/null &&
  pg_psql -h 127.0.0.1 -p 5489 -c 'SET client_min_messages = warning' -c 'SET citus.enable_create_role_propagation = off' \
    -c 'CREATE ROLE citus_filler_1' -c 'CREATE ROLE citus_filler_2' >/dev/null &&
  pg_psql "${upgrade[@]}" -c 'CREATE ROLE citus_upgrader LOGIN' \
    -c 'GRANT USAGE ON SCHEMA idempotency TO citus_upgrader' >/dev/null; then
  refused="$(pg_psql "${upgrade[@]}" -v VERBOSITY=verbose -U citus_upgrader \
    -c "SELECT status FROM idempotency.claim_key('up-1')" 2>&1)"
  # One multi-row VALUES: Citus sends each shard its rows as SQL text, so the regrole arrives by
  # name (an INSERT .. SELECT may ship it in binary, as the coordinator's OID). citus_upgrader's
  # OID differs between the nodes (roles made on one worker only first); citus_gone's 20 keys
  # are of a role dropped before the update.
  rows=()
  for g in $(seq 1 70); do
    rows+=("('$( ((g <= 50)) && echo citus_upgrader || echo citus_gone)', '', 'up-$g', 1, '1 day', '1 day', now(),
            now() + interval '1 day', idempotency.gen_uuid_v7(), now() + interval '1 day', 'processing', now())")
  done
  if pg_psql "${upgrade[@]}" -c "INSERT INTO idempotency.idempotency_keys (owner, scope, key, attempts, ttl, lease,
          created_at, expires_at, lease_token, locked_until, status, updated_at)
        VALUES $(IFS=,; echo "${rows[*]}")" \
    -c 'DROP ROLE citus_gone' -c "ALTER EXTENSION idempotency UPDATE" >/dev/null; then
    answer="$(pg_psql "${upgrade[@]}" -At -F ' ' \
      -c "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'" \
      -c "SELECT string_agg(DISTINCT owner || ':' || n, ',') FROM (SELECT owner, count(*) OVER () AS n
            FROM idempotency.idempotency_keys) k" \
      -c "SELECT DISTINCT result FROM run_command_on_shards('idempotency.idempotency_keys',
            \$\$SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = '%s'::regclass AND contype = 'p'\$\$)" |
      tr '\n' '|')"
    answer+="$(pg_psql "${upgrade[@]}" -At -U citus_upgrader \
      -c "SELECT string_agg(status || ':' || n, ',' ORDER BY status) FROM (SELECT status::text, count(*) AS n
            FROM (SELECT (idempotency.claim_key('up-' || g)).status FROM generate_series(1, 60) g) c GROUP BY 1) s")"
  else
    answer="the update failed"
  fi
else
  answer="the cluster did not start"
fi
if [[ $refused == *"ERROR:  55000: idempotency_keys was made by idempotency 1.1 or older"* ]]; then
  echo "ok - before the update, the 1.3 library refuses the 1.0 table through Citus (55000)"
  PASSED=$((PASSED + 1))
else
  echo "not ok - before the update, the 1.3 library refuses the 1.0 table through Citus (55000): got '$refused'"
  FAILED=$((FAILED + 1))
fi
expected='1.3|citus_upgrader:50|PRIMARY KEY (key, scope, owner)|claimed:10,in_progress:50'
if [[ $answer == "$expected" ]]; then
  echo "ok - ALTER EXTENSION UPDATE from 1.0 on Citus: 1.3, 50 keys kept with their owner's name (an OID of its node), a dropped role's 20 gone, every shard's primary key rebuilt, claims answer"
  PASSED=$((PASSED + 1))
else
  echo "not ok - ALTER EXTENSION UPDATE from 1.0 on Citus (expected '$expected', got '$answer')"
  FAILED=$((FAILED + 1))
fi

echo "$PASSED passed, $FAILED failed"
((FAILED == 0))
