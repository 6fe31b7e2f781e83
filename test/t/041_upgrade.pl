# ALTER EXTENSION idempotency UPDATE from 1.0 (the released base) through 1.1 and 1.2 to 1.3: an
# upgraded install equals a fresh one, in the catalog (every object of the extension, its
# definition, comment and grants; the table's columns and indexes; the configuration dump)
# and in behaviour, and keeps every key of an existing role (completed, processing,
# released, of several roles), whose open claims can still be completed with their tokens.
# 1.2 stores a key's owner as the role's name: the update converts the OIDs of 1.0 / 1.1 and
# deletes the keys of roles dropped before it (they have no name to keep). The 1.2 library
# refuses an older table until the update (55000), writing nothing.
# 1.3 stamps each key with its role's OID and the cluster's system identifier: the update from
# 1.2 stamps the keys of existing roles and deletes those whose name names no role (a role
# dropped before the update, whose keys the cleanup had not deleted yet).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('upgrade');
$node->init;
$node->start;

$node->safe_psql('postgres', q{
  CREATE ROLE app1 LOGIN;
  CREATE ROLE app2 LOGIN;
  CREATE ROLE gone LOGIN;
  CREATE DATABASE fresh;
  CREATE DATABASE upgraded;
});
$node->safe_psql('fresh', 'CREATE EXTENSION idempotency');
$node->safe_psql('upgraded', q{CREATE EXTENSION idempotency VERSION '1.0'});
is($node->safe_psql('upgraded', q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}), '1.0',
  'the old version is installed');
is($node->safe_psql('upgraded', q{SELECT count(*) FROM pg_proc WHERE proname = 'claim_keys'}), '0',
  '1.0 has no batch functions');
for my $db ('fresh', 'upgraded') {
  $node->safe_psql($db, 'GRANT USAGE ON SCHEMA idempotency TO app1, app2');
}

# Keys as 1.0 stored them (owner a regrole): completed with fingerprints in scope 's',
# processing (two-phase: claimed, committed) and released in scope '', of two roles, and keys
# of a role dropped since. Written by hand: this library no longer serves a 1.0 table.
$node->safe_psql('upgraded', q{
  INSERT INTO idempotency.idempotency_keys (owner, scope, key, fingerprint, attempts, ttl, lease, created_at,
                                            expires_at, lease_token, locked_until, status, response_code,
                                            updated_at, response)
  SELECT r::regrole, 's', 'done-' || g, idempotency.request_fingerprint(g::text), 1, '24 hours', '5 min', now(),
         now() + interval '24 hours', idempotency.gen_uuid_v7(), now() + interval '5 min', 'completed', 200, now(),
         jsonb_build_object('n', g)
    FROM generate_series(1, 200) g, unnest(ARRAY['app1', 'app2', 'gone']) r;
  INSERT INTO idempotency.idempotency_keys (owner, scope, key, attempts, ttl, lease, created_at, expires_at,
                                            lease_token, locked_until, status, updated_at)
  SELECT r::regrole, '', 'held-' || g, 1, '24 hours', '5 min', now(), now() + interval '24 hours',
         idempotency.gen_uuid_v7(), now() + interval '5 min', 'processing', now()
    FROM generate_series(1, 50) g, unnest(ARRAY['app1', 'app2', 'gone']) r;
  UPDATE idempotency.idempotency_keys SET lease_token = NULL, locked_until = NULL WHERE key LIKE 'held-1%';
  DROP ROLE gone;
});
# The same keys on the fresh install, made by the functions.
my $make_keys = q{
  SELECT count(idempotency.complete_key('done-' || g,
                 (idempotency.claim_key('done-' || g, idempotency.request_fingerprint(g::text), 's')).token,
                 jsonb_build_object('n', g), 200, 's'))
    FROM generate_series(1, 200) g;
  CREATE TEMP TABLE held AS
    SELECT 'held-' || g AS key, (idempotency.claim_key('held-' || g)).token FROM generate_series(1, 50) g;
  SELECT count(idempotency.release_key(key, token)) FROM held WHERE key LIKE 'held-1%';
};
$node->safe_psql('fresh', $make_keys, extra_params => [ '-U', 'app1' ]);
$node->safe_psql('fresh', $make_keys, extra_params => [ '-U', 'app2' ]);
# The tokens of open claims, to complete them after the upgrade.
my $tokens = $node->safe_psql('upgraded', q{
  SELECT string_agg(key || '=' || lease_token, ',' ORDER BY key) FROM idempotency.idempotency_keys
   WHERE owner = 'app1'::regrole AND key IN ('held-2', 'held-3') });
my $rows_query = q{
  SELECT md5(string_agg(row(owner::text, scope, key, fingerprint, status, response, response_code, recovery_point,
                            lease_token, locked_until, attempts, ttl, lease, created_at, expires_at, updated_at)::text,
                        ',' ORDER BY owner::text, scope, key)) || ' ' || count(*)
    FROM idempotency.idempotency_keys k WHERE EXISTS (SELECT FROM pg_roles r WHERE r.rolname = k.owner::text)};
my $rows_before = $node->safe_psql('upgraded', $rows_query);
is($node->safe_psql('upgraded', 'SELECT count(*) FROM idempotency.idempotency_keys'), '750',
  '750 keys before the update, 250 of them of the dropped role');

# Before the update the library refuses the old table and writes nothing.
my ($rc, $out, $err) = $node->psql('upgraded', q{SELECT status FROM idempotency.claim_key('done-1', NULL, 's')},
  extra_params => [ '-U', 'app1', '-v', 'VERBOSITY=verbose' ]);
like($err, qr/55000.*made by idempotency 1\.1 or older/s, 'a 1.0 table: claim_key refuses with 55000');
like($err, qr/ALTER EXTENSION idempotency UPDATE/, '... and says how to update');
is($node->safe_psql('upgraded', $rows_query), $rows_before, '... and writes nothing');

# The primary key of 1.2 compares the key first; replays find their rows in the first probe,
# so they write nothing (a probe that missed would insert, find the conflict, and take the
# tuple back).
my $replays_wal = q{
  SELECT pg_current_wal_insert_lsn() AS before \gset
  SELECT count(*) FILTER (WHERE status = 'replay') || ' replays, ' ||
         pg_wal_lsn_diff(pg_current_wal_insert_lsn(), :'before') || ' WAL bytes'
    FROM (SELECT (idempotency.claim_key('done-' || g, idempotency.request_fingerprint(g::text), 's')).status
            FROM generate_series(1, 200) g) c;
};
is($node->safe_psql('upgraded', q{SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'idempotency_keys_pkey'}),
  'PRIMARY KEY (owner, scope, key)', "1.0's primary key order");

$node->safe_psql('upgraded', 'ALTER EXTENSION idempotency UPDATE');
is($node->safe_psql('upgraded', q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}), '1.3',
  'ALTER EXTENSION UPDATE goes to 1.3');
is($node->safe_psql('fresh', q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}), '1.3',
  'a fresh install is 1.3');

# The catalog of the extension, one line per fact, without OIDs.
my %catalog = (
  'objects and comments' => q{
    SELECT pg_describe_object(classid, objid, objsubid) || ' | ' || coalesce(obj_description(objid, classid::regclass::name), '-')
      FROM pg_depend WHERE refclassid = 'pg_extension'::regclass
       AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency') AND deptype = 'e'
     ORDER BY 1},
  'functions' => q{
    SELECT pg_get_functiondef(p.oid) || ' | ' || coalesce(p.proacl::text, 'default') || ' | ' ||
           coalesce(obj_description(p.oid, 'pg_proc'), '-')
      FROM pg_proc p WHERE p.pronamespace = 'idempotency'::regnamespace ORDER BY p.oid::regprocedure::text},
  'types' => q{
    SELECT t.typname || ' ' || t.typtype::text || ' ' || coalesce(
             (SELECT string_agg(enumlabel, ',' ORDER BY enumsortorder) FROM pg_enum WHERE enumtypid = t.oid),
             (SELECT string_agg(attname || ':' || format_type(atttypid, atttypmod), ',' ORDER BY attnum)
                FROM pg_attribute WHERE attrelid = t.typrelid AND attnum > 0), '')
      FROM pg_type t WHERE t.typnamespace = 'idempotency'::regnamespace ORDER BY 1},
  'columns' => q{
    SELECT c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod) || ' ' || a.attnotnull || ' ' ||
           coalesce(pg_get_expr(d.adbin, d.adrelid), '-') || ' ' || coalesce(co.collname, '-') || ' ' ||
           coalesce(col_description(c.oid, a.attnum), '-')
      FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
      LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
      LEFT JOIN pg_collation co ON co.oid = a.attcollation AND a.attcollation <> 0
     WHERE c.relnamespace = 'idempotency'::regnamespace ORDER BY 1},
  'relations, grants and options' => q{
    SELECT c.relname || ' ' || c.relkind::text || ' ' || coalesce(c.relacl::text, 'default') || ' ' ||
           coalesce(c.reloptions::text, '-') || ' ' || c.relrowsecurity
      FROM pg_class c WHERE c.relnamespace = 'idempotency'::regnamespace ORDER BY 1},
  'indexes and constraints' => q{
    SELECT pg_get_indexdef(indexrelid) FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
     WHERE c.relnamespace = 'idempotency'::regnamespace
    UNION ALL
    SELECT conname || ' ' || pg_get_constraintdef(oid) FROM pg_constraint
     WHERE connamespace = 'idempotency'::regnamespace ORDER BY 1},
  'schema and extension' => q{
    SELECT n.nspname || ' ' || n.nspacl::text || ' | ' || e.extrelocatable || ' ' ||
           (SELECT string_agg(x::regclass::text, ',') FROM unnest(e.extconfig) x) || ' ' || coalesce(e.extcondition::text, '-')
      FROM pg_namespace n, pg_extension e WHERE n.nspname = 'idempotency' AND e.extname = 'idempotency'},
);
for my $what (sort keys %catalog) {
  my $fresh = $node->safe_psql('fresh', $catalog{$what});
  my $upgraded = $node->safe_psql('upgraded', $catalog{$what});
  cmp_ok(length($fresh), '>', 0, "$what: the query sees the extension");
  is($upgraded, $fresh, "$what: upgraded equals fresh");
}

is($node->safe_psql('upgraded', $rows_query), $rows_before,
  'every key of an existing role is kept, unchanged but for its owner, now the role\'s name (rows and count)');
is($node->safe_psql('upgraded', 'SELECT count(*) FROM idempotency.idempotency_keys'), '500',
  'the keys of the role dropped before the update are gone');
is($node->safe_psql('upgraded', q{SELECT string_agg(DISTINCT owner, ',' ORDER BY owner) FROM idempotency.idempotency_keys}),
  'app1,app2', 'owners are role names');
is($node->safe_psql('upgraded', q{SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'idempotency_keys_pkey'}),
  'PRIMARY KEY (key, scope, owner)', "1.2's primary key order after the upgrade");
is($node->safe_psql('upgraded', $replays_wal, extra_params => [ '-U', 'app1' ]), '200 replays, 0 WAL bytes',
  "1.2's order: 200 replays, each found by the first probe, write nothing");
like($rows_before, qr/ 500$/, 'of 500 keys of existing roles made as 1.0 stored them');

# Behaviour after the upgrade: the old keys answer as before, the new functions work on
# them, and the open claims of 1.0 can be completed with their tokens.
my $behaviour = q{
  SELECT string_agg(key || ':' || status, ',' ORDER BY ordinality)
    FROM idempotency.claim_keys(ARRAY['done-1', 'done-2', 'held-2', 'held-10', 'new-1', 'new-1'],
                                ARRAY[idempotency.request_fingerprint('1'), idempotency.request_fingerprint('x'),
                                      NULL, NULL, NULL, NULL], 's');
};
my $old_keys = q{
  SELECT string_agg(key || ':' || status, ',' ORDER BY ordinality)
    FROM idempotency.claim_keys(ARRAY['held-2', 'held-10', 'held-11', 'new-2']);
};
my %answer;
for my $db ('fresh', 'upgraded') {
  $answer{$db} = $node->safe_psql($db, $behaviour, extra_params => [ '-U', 'app1' ])
    . ' ' . $node->safe_psql($db, $old_keys, extra_params => [ '-U', 'app1' ]);
}
# In scope 's': done-1 replays, done-2 mismatches (another fingerprint), held-* were made in
# scope '' (so these are new keys), new-1 repeated: first claimed, then in_progress. In
# scope '': held-2 is still held (live lease), held-1x were released (reclaimed).
is($answer{upgraded}, 'done-1:replay,done-2:mismatch,held-2:claimed,held-10:claimed,new-1:claimed,new-1:in_progress'
  . ' held-2:in_progress,held-10:reclaimed,held-11:reclaimed,new-2:claimed',
  'claim_keys on keys made as 1.0 stored them: replay, mismatch, in_progress, reclaimed, claimed');
is($answer{upgraded}, $answer{fresh}, 'the same answers on a fresh install with the same keys');
my ($key, $token) = split /=/, (split /,/, $tokens)[0];
is($node->safe_psql('upgraded', qq{
    SELECT string_agg(key || ':' || status || ':' || response::text, ',')
      FROM idempotency.complete_keys(ARRAY['$key'], ARRAY['$token'::uuid], ARRAY['{"after": "upgrade"}'::jsonb])},
    extra_params => [ '-U', 'app1' ]),
  qq{$key:replay:{"after": "upgrade"}}, 'a claim stored by 1.0 is completed after the upgrade with its token');

# A 1.0 claim completed after the upgrade with a response as sent (issue #24): body bytes and
# headers, replayed as stored; the keys stored by 1.0 replay without either.
my ($held3) = $tokens =~ /held-3=([0-9a-f-]+)/;
is($node->safe_psql('upgraded', qq{
    SELECT row(status, response_code, response_body, response_headers)::text
      FROM idempotency.complete_key('held-3', '$held3', NULL, 201, '', '\\x00ff0a', '{"Location": "/p/3"}')},
    extra_params => [ '-U', 'app1' ]),
  '(replay,201,"\\\\x00ff0a","{""Location"": ""/p/3""}")', 'a claim stored by 1.0 is completed with a body and headers');
is($node->safe_psql('upgraded', q{
    SELECT string_agg(row(key, status, response_body, response_headers)::text, ' ' ORDER BY ordinality)
      FROM idempotency.claim_keys(ARRAY['held-3', 'done-1'], NULL, '') WHERE key = 'held-3'
    UNION ALL
    SELECT string_agg(row(key, status, response, response_body, response_headers)::text, ' ')
      FROM idempotency.claim_keys(ARRAY['done-1'], NULL, 's')}, extra_params => [ '-U', 'app1' ]),
  qq{(held-3,replay,"\\\\x00ff0a","{""Location"": ""/p/3""}")\n(done-1,replay,"{""n"": 1}",,)},
  'claim_keys replays them; a key completed by 1.0 replays its jsonb response without body or headers');

is($node->safe_psql('upgraded', q{
    SELECT count(*) FILTER (WHERE owner_oid IS DISTINCT FROM owner::regrole
                              OR owner_system IS DISTINCT FROM (SELECT system_identifier FROM pg_control_system()))
           || '/' || count(*) FROM idempotency.idempotency_keys}),
  '0/505', 'every key kept through the update (and each made since) is stamped with its role and this cluster');

# --- 1.2 -> 1.3 with keys of several roles in place, one of them dropped ------------------
$node->safe_psql('postgres', q{CREATE ROLE gone12 LOGIN; CREATE DATABASE v12});
$node->safe_psql('v12', q{CREATE EXTENSION idempotency VERSION '1.2'});
$node->safe_psql('v12', q{
  GRANT USAGE ON SCHEMA idempotency TO app1, app2, gone12;
  INSERT INTO idempotency.idempotency_keys (owner, scope, key, attempts, ttl, lease, created_at, expires_at,
                                            lease_token, locked_until, status, response_code, updated_at, response)
  SELECT r, '', 'k-' || g, 1, '24 hours', '5 min', now(), now() + interval '24 hours', idempotency.gen_uuid_v7(),
         now() + interval '5 min', CASE WHEN g % 2 = 0 THEN 'completed' ELSE 'processing' END::idempotency.key_status,
         CASE WHEN g % 2 = 0 THEN 200 END, now(), CASE WHEN g % 2 = 0 THEN jsonb_build_object('by', r) END
    FROM generate_series(1, 20) g, unnest(ARRAY['app1', 'app2', 'gone12']) r;
  DROP OWNED BY gone12;
});
$node->safe_psql('postgres', 'DROP ROLE gone12');
($rc, $out, $err) = $node->psql('v12', q{SELECT status FROM idempotency.claim_key('k-2')},
  extra_params => [ '-U', 'app1', '-v', 'VERBOSITY=verbose' ]);
like($err, qr/55000.*made by idempotency 1\.2.*ALTER EXTENSION idempotency UPDATE/s,
  'a 1.2 table: claim_key refuses with 55000 and says how to update');
# The role is created again under the dropped role's name before the update: 1.2 kept no OID,
# so the update cannot tell the earlier role's keys from the new role's and stamps them with
# the new role (the exposure of 1.2, closed from 1.3 on; SECURITY.md).
$node->safe_psql('postgres', 'CREATE ROLE gone12 LOGIN');
$node->safe_psql('v12', 'ALTER EXTENSION idempotency UPDATE');
is($node->safe_psql('v12', q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}), '1.3',
  '1.2 is updated to 1.3');
is($node->safe_psql('v12', q{
    SELECT string_agg(owner || ':' || n, ',' ORDER BY owner) FROM (
      SELECT owner, count(*) FILTER (WHERE owner_oid = owner::regrole
                                       AND owner_system = (SELECT system_identifier FROM pg_control_system())) n
        FROM idempotency.idempotency_keys GROUP BY owner) o}),
  'app1:20,app2:20,gone12:20', 'the update stamps every key with the OID its owner name names now');
# The expiry index is rebuilt by the update with the keys in place: a BRIN over the expiry's
# minute on 16 and later (a completion then stays a HOT update), the B-Tree kept on 15; either
# way it finds every key (on 16+ by the bucket, as the cleanup's first batch asks).
my $summarizing = $node->safe_psql('v12', q{SELECT current_setting('server_version_num')::int >= 160000}) eq 't';
is($node->safe_psql('v12', q{
    SELECT a.amname || ' ' || regexp_replace(pg_get_indexdef(x.indexrelid, 1, true), '^idempotency\.', '')
           || ' ' || x.indisvalid
      FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
      JOIN pg_am a ON a.oid = i.relam WHERE x.indexrelid = 'idempotency.idempotency_keys_expires_at_idx'::regclass}),
  $summarizing ? 'brin expiry_bucket(expires_at) true' : 'btree expires_at true',
  'the update leaves the expiry index of this major, valid');
is($node->safe_psql('v12', q{SET enable_seqscan = off;
    SELECT count(*) FROM idempotency.idempotency_keys
     WHERE idempotency.expiry_bucket(expires_at) >= idempotency.expiry_bucket(now() - interval '1 hour')
       AND expires_at > now() - interval '1 hour'}),
  '60', 'a scan of the expiry index finds every key in place after the update');
is($node->safe_psql('v12', q{BEGIN;
    SELECT (idempotency.complete_key('hot-1', (idempotency.claim_key('hot-1')).token, '{}'::jsonb)).status;
    SELECT n_tup_hot_upd || '/' || n_tup_upd FROM pg_stat_xact_user_tables
     WHERE relid = 'idempotency.idempotency_keys'::regclass;
    COMMIT;}, extra_params => [ '-U', 'app1' ]),
  $summarizing ? "replay\n1/1" : "replay\n0/1",
  'after the update a completion is a HOT update on 16+ (on 15 the B-Tree covers expires_at)');
$node->safe_psql('v12', 'GRANT USAGE ON SCHEMA idempotency TO gone12');
is($node->safe_psql('v12', q{SELECT status || ' ' || response::text FROM idempotency.claim_key('k-2')},
    extra_params => [ '-U', 'app2' ]), 'replay {"by": "app2"}', 'and each role replays its keys after the update');

# The life cycle of 1.3 on the keys that were in place (issue #37): look_key answers as claim_key
# (replay of a 1.2 completion, with response_dropped false: 1.2's keys keep their response as
# long as the key), forget_key deletes a completed key and refuses a live 1.2 claim, the stuck
# holders view counts the 1.2 claims, complete_key takes a response_ttl, and the statistics have
# forgotten.
is($node->safe_psql('v12', q{SELECT status || ' ' || response::text || ' ' || response_dropped FROM idempotency.look_key('k-4')},
    extra_params => [ '-U', 'app1' ]), 'replay {"by": "app1"} false', 'look_key on a 1.2 key after the update');
is($node->safe_psql('v12', q{SELECT status || ' ' || (token IS NULL) FROM idempotency.look_key('k-3')},
    extra_params => [ '-U', 'app1' ]), 'in_progress true', 'look_key on a live 1.2 claim: in_progress, no token');
is($node->safe_psql('v12', q{SELECT idempotency.forget_key('k-4')}, extra_params => [ '-U', 'app1' ]), 't',
  'forget_key deletes a 1.2 completed key');
is($node->safe_psql('v12', q{SELECT status FROM idempotency.claim_key('k-4')}, extra_params => [ '-U', 'app1' ]), 'claimed',
  '... which is claimed afresh');
($rc, $out, $err) = $node->psql('v12', q{SELECT idempotency.forget_key('k-5')},
  extra_params => [ '-U', 'app1', '-v', 'VERBOSITY=verbose' ]);
like($err, qr/55000.*held by a live claim/s, 'forget_key refuses a live 1.2 claim without its token');
is($node->safe_psql('v12', q{SELECT string_agg(role || ':' || processing, ',' ORDER BY role) FROM idempotency.stuck_holders}),
  'app1:11,app2:10,gone12:10', "stuck_holders counts the claims in place (and app1's new one)");
is($node->safe_psql('v12', q{
    SELECT (idempotency.complete_key('n-1', (idempotency.claim_key('n-1')).token, '{"new": true}'::jsonb,
                                     response_ttl => '1 hour')).response_dropped}, extra_params => [ '-U', 'app1' ]),
  'f', 'complete_key takes a response_ttl after the update');
is($node->safe_psql('v12', q{SELECT count(*) FROM pg_attribute WHERE attrelid = 'idempotency.idempotency_stats'::regclass AND attname = 'forgotten'}),
  '1', 'idempotency_stats has forgotten after the update');

# A role dropped with keys in place, no cleanup in between, then the update: its keys go.
$node->safe_psql('postgres', q{CREATE ROLE gone13 LOGIN; CREATE DATABASE v12b});
$node->safe_psql('v12b', q{
  CREATE EXTENSION idempotency VERSION '1.2';
  INSERT INTO idempotency.idempotency_keys (owner, scope, key, attempts, ttl, lease, created_at, expires_at,
                                            status, updated_at)
  SELECT r, '', 'k-' || g, 1, '24 hours', '5 min', now(), now() + interval '24 hours', 'completed', now()
    FROM generate_series(1, 10) g, unnest(ARRAY['app1', 'gone13']) r;
});
$node->safe_psql('postgres', 'DROP ROLE gone13');
$node->safe_psql('v12b', 'ALTER EXTENSION idempotency UPDATE');
is($node->safe_psql('v12b', q{SELECT string_agg(DISTINCT owner, ',') || ' ' || count(*) FROM idempotency.idempotency_keys}),
  'app1 10', 'the update deletes the keys of a role dropped before it');

$node->stop;
done_testing();
