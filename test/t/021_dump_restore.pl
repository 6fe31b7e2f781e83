# pg_dump / pg_restore keep every key and its state: idempotency_keys is registered with
# pg_extension_config_dump, so its rows travel with the dump (custom and plain format).
# After the restore a duplicate replays, a live lease is in_progress, a released key is
# reclaimed, and a token taken before the dump still completes its key. Keys belong to
# roles by name: a restore into another cluster gives them to the roles of the same names,
# and the keys of a role dropped before the dump are left out of it, even when a role of the
# same name was created since (the keys carry the OID of the role that made them, 1.3).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('dump');
$node->init;
# The cleanup worker serves no database here: the keys of the dropped role below must
# still be in the table when pg_dump runs.
$node->append_conf('postgresql.conf', qq{shared_preload_libraries = 'idempotency'
idempotency.databases = 'no_such_database'});
$node->start;

$node->safe_psql('postgres', q{
  CREATE ROLE app_a LOGIN;
  CREATE ROLE app_b LOGIN;
  CREATE ROLE app_gone LOGIN;
  CREATE DATABASE src;
});
$node->safe_psql('src', q{
  CREATE EXTENSION idempotency;
  GRANT USAGE ON SCHEMA idempotency TO app_a, app_b, app_gone;
  CREATE TABLE tokens (k text PRIMARY KEY, t uuid);
  GRANT ALL ON tokens TO PUBLIC;
});
# Every state, two roles, several scopes, fingerprints, recovery points, multibyte keys.
$node->safe_psql('src', q{
  SET ROLE app_a;
  INSERT INTO tokens SELECT 'done-' || g,
    (idempotency.claim_key('done-' || g, idempotency.request_fingerprint(g::text), 's' || (g % 3))).token
    FROM generate_series(1, 300) g;
  SELECT idempotency.checkpoint_key(k, t, 'step-' || substr(k, 6), 's' || (substr(k, 6)::int % 3)) FROM tokens;
  SELECT idempotency.complete_key(k, t, jsonb_build_object('k', k, 'nested', jsonb_build_array(1, 'é', null)),
                           200 + substr(k, 6)::int % 5, 's' || (substr(k, 6)::int % 3)) FROM tokens;
  INSERT INTO tokens VALUES
    ('held', (idempotency.claim_key('held', NULL, '', '7 days', '1 hour')).token),
    ('released', (idempotency.claim_key('released', '\x0102'::bytea, '', NULL, '1 hour')).token),
    ('two-phase', (idempotency.claim_key('two-phase', NULL, 'pay', NULL, '1 hour')).token),
    ('ключ-€-𝄞', (idempotency.claim_key('ключ-€-𝄞', NULL, 'ユーザー', NULL, '1 hour')).token);
  SELECT idempotency.checkpoint_key('released', (SELECT t FROM tokens WHERE k = 'released'), 'half-way');
  SELECT idempotency.release_key('released', (SELECT t FROM tokens WHERE k = 'released'));
  SET ROLE app_b;
  SELECT idempotency.claim_key('of-b', NULL, '', NULL, '1 hour');
  SET ROLE app_gone;
  SELECT idempotency.claim_key('gone-' || g, NULL, '', NULL, '1 hour') FROM generate_series(1, 7) g;
  SELECT idempotency.claim_key('of-b', NULL, '', NULL, '1 hour');
});
# A role dropped with its keys still in the table (the cleanup would delete them).
$node->safe_psql('src', q{REVOKE USAGE ON SCHEMA idempotency FROM app_gone; DROP ROLE app_gone});
# A role dropped and created again under its name: the earlier role's keys are no one's.
$node->safe_psql('postgres', 'CREATE ROLE app_reused LOGIN');
$node->safe_psql('src', q{
  GRANT USAGE ON SCHEMA idempotency TO app_reused;
  SET ROLE app_reused;
  SELECT idempotency.claim_key('reused-' || g, NULL, '', NULL, '1 hour') FROM generate_series(1, 3) g;
  RESET ROLE;
  REVOKE USAGE ON SCHEMA idempotency FROM app_reused;
  DROP ROLE app_reused;
  CREATE ROLE app_reused LOGIN;
});
is($node->safe_psql('src', q{SELECT count(*) FROM idempotency.idempotency_keys WHERE owner = 'app_reused'}),
  '3', 'the source holds 3 keys of a dropped role whose name a new role has');
is($node->safe_psql('src', q{SELECT count(*) FROM idempotency.idempotency_keys
                              WHERE NOT EXISTS (SELECT FROM pg_roles r WHERE r.rolname = owner)}),
  '8', 'the source holds 8 keys of a dropped role');

my $state = q{SELECT count(*) || E'\n' || string_agg(format('%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s',
  scope, key, owner, encode(fingerprint, 'hex'), status, response, response_code, recovery_point,
  lease_token, locked_until, attempts, ttl, lease, created_at, expires_at, updated_at), E'\n' ORDER BY scope, key, owner::text)
  FROM idempotency.idempotency_keys
 WHERE EXISTS (SELECT FROM pg_roles r WHERE r.rolname = owner AND r.oid = owner_oid)};
my $before = $node->safe_psql('src', $state);
like($before, qr/^305\n/, 'the source holds 305 keys of existing roles');

my $dir = $PostgreSQL::Test::Utils::tmp_check;
$node->command_ok([ 'pg_dump', '-Fc', '-d', $node->connstr('src'), '-f', "$dir/src.dump" ], 'pg_dump -Fc');
$node->safe_psql('postgres', 'CREATE DATABASE dst_custom; CREATE DATABASE dst_plain');
$node->command_ok([ 'pg_restore', '--exit-on-error', '-d', $node->connstr('dst_custom'), "$dir/src.dump" ],
  'pg_restore into an empty database');
$node->command_ok([ 'pg_dump', '-Fp', '-d', $node->connstr('src'), '-f', "$dir/src.sql" ], 'pg_dump -Fp');
$node->command_ok([ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('dst_plain'),
  '-f', "$dir/src.sql" ], 'plain dump restored with psql');

for my $db ('dst_custom', 'dst_plain') {
  is($node->safe_psql($db, $state), $before,
    "$db: every key with its state (owner, fingerprint, status, response, token, lease, attempts, ttl, expiry)");
  is($node->safe_psql($db, q{SELECT count(*) FROM idempotency.idempotency_keys}), '305',
    "$db: and no key of the dropped role, nor of the role dropped and created again (left out of the dump)");

  is($node->safe_psql($db, q{
      SET ROLE app_a;
      SELECT count(*) FROM generate_series(1, 300) g,
        LATERAL idempotency.claim_key('done-' || g, idempotency.request_fingerprint(g::text), 's' || (g % 3)) c
       WHERE c.status = 'replay' AND c.response->>'k' = 'done-' || g
         AND c.response_code = 200 + g % 5 AND c.recovery_point = 'step-' || g}),
    '300', "$db: all 300 completed keys replay their response and code");
  is($node->safe_psql($db, q{SET ROLE app_a; SELECT status FROM idempotency.claim_key('done-1', idempotency.request_fingerprint('x'), 's1')}),
    'mismatch', "$db: the stored fingerprint still rejects a different request");
  is($node->safe_psql($db, q{SET ROLE app_a; SELECT status FROM idempotency.claim_key('held')}),
    'in_progress', "$db: a live lease is still in_progress");
  is($node->safe_psql($db, q{SET ROLE app_a; SELECT status || ' ' || attempts || ' ' || recovery_point FROM idempotency.claim_key('released')}),
    'reclaimed 2 half-way', "$db: a released key is reclaimed with its recovery point");
  is($node->safe_psql($db, q{SET ROLE app_a;
      SELECT status FROM idempotency.complete_key('two-phase', (SELECT t FROM tokens WHERE k = 'two-phase'), '{"ok": true}', 200, 'pay')}),
    'replay', "$db: a token taken before the dump completes its key after the restore");
  is($node->safe_psql($db, q{SET ROLE app_a; SELECT status FROM idempotency.claim_key('ключ-€-𝄞', NULL, 'ユーザー')}),
    'in_progress', "$db: multibyte key and scope survive");
  # Ownership survives: app_b's key is app_b's; for app_a the same key is another, fresh one.
  is($node->safe_psql($db, q{SET ROLE app_b; SELECT status FROM idempotency.claim_key('of-b')}),
    'in_progress', "$db: app_b's key is still held by app_b");
  is($node->safe_psql($db, q{SET ROLE app_a; SELECT status || ' ' || attempts FROM idempotency.claim_key('of-b')}),
    'claimed 1', "$db: for app_a the same (scope, key) is a key of its own, claimed afresh");
}

# Another cluster: the same role names get other OIDs (created in another order, after
# another role), as after pg_dumpall --globals-only on a new server.
my $other = PostgreSQL::Test::Cluster->new('other');
$other->init;
# No worker round here: the restored rows keep the source's stamp until the call below.
$other->append_conf('postgresql.conf', "shared_preload_libraries = 'idempotency'\nidempotency.cleanup_worker = off");
$other->start;
$other->safe_psql('postgres', q{
  CREATE ROLE someone_else; CREATE ROLE another; CREATE ROLE app_b LOGIN; CREATE ROLE app_a LOGIN;
  CREATE DATABASE dst;
});
$other->command_ok([ 'pg_restore', '--exit-on-error', '-d', $other->connstr('dst'), "$dir/src.dump" ],
  'pg_restore into another cluster');
is($other->safe_psql('dst', q{SELECT count(*) FROM idempotency.idempotency_keys}), '305',
  'another cluster: every key restored');
{
  my ($rc, $out, $err) = $other->psql('dst',
    q{SET ROLE app_a; SELECT status FROM idempotency.claim_key('done-1', idempotency.request_fingerprint('1'), 's1')});
  is("$rc $out", '0 replay', "another cluster: the key's owner (by role name) still replays it ($err)");
  ($rc, $out, $err) = $other->psql('dst', q{SET ROLE app_b; SELECT status FROM idempotency.claim_key('of-b', NULL, '')});
  is("$rc $out", '0 in_progress', "another cluster: app_b's key is still app_b's ($err)");
  # The stored OID of app_a names someone_else here: keys are restored by role name, so
  # for someone_else (given USAGE, so that it can call at all) app_a's key is absent.
  $other->safe_psql('dst', 'GRANT USAGE ON SCHEMA idempotency TO someone_else');
  is($other->safe_psql('dst', q{SELECT count(*) FROM idempotency.idempotency_keys
                                 WHERE owner = 'someone_else'}),
    '0', 'another cluster: no key belongs to the role that got app_a\'s old OID');
  ($rc, $out, $err) = $other->psql('dst',
    q{SET ROLE someone_else; SELECT status FROM idempotency.claim_key('done-1', idempotency.request_fingerprint('1'), 's1')});
  is("$rc $out", '0 claimed', "another cluster: an unrelated role that got the old OID cannot replay app_a's key ($err)");
  # The rows carry the source cluster's stamp: adopted by name until the cleanup stamps them
  # with the roles of this cluster. A role dropped and created again after that gets none.
  is($other->safe_psql('dst', q{SELECT count(*) FROM idempotency.idempotency_keys
                                 WHERE owner_system <> (SELECT system_identifier FROM pg_control_system())}),
    '305', 'another cluster: the restored keys carry the source cluster\'s stamp');
  $other->safe_psql('dst', 'SELECT idempotency.idempotency_cleanup()');
  is($other->safe_psql('dst', q{SELECT count(*) FROM idempotency.idempotency_keys k
                                 WHERE owner_oid = (SELECT oid FROM pg_roles WHERE rolname = k.owner)
                                   AND owner_system = (SELECT system_identifier FROM pg_control_system())}),
    '306', 'another cluster: the cleanup stamps them with the roles of their names here');
  $other->safe_psql('dst', q{DROP OWNED BY app_b; DROP ROLE app_b;
                              CREATE ROLE app_b LOGIN; GRANT USAGE ON SCHEMA idempotency TO app_b});
  ($rc, $out, $err) = $other->psql('dst', q{SET ROLE app_b; SELECT status FROM idempotency.claim_key('of-b', NULL, '')});
  is("$rc $out", '0 claimed', "another cluster: a role created again under app_b's name does not get app_b's key ($err)");
}

done_testing();
