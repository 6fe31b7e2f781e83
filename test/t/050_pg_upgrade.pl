# pg_upgrade from one major to the next keeps every key: a cluster holding keys in every
# state (completed, processing with a live lease, released, expired) and the worker
# preloaded is upgraded with pg_upgrade --link-free copy mode; afterwards every key has its
# state, token, fingerprint and expiry, duplicates replay, held keys answer in_progress, the
# old holder's token still completes, and the cleanup worker deletes expired keys.
#
# It needs two installations of PostgreSQL, each with the extension installed:
#   IDEM_UPGRADE_OLD=/opt/pg16 IDEM_UPGRADE_NEW=/opt/pg17 bash test/run.sh tap:050_pg_upgrade
# (test/matrix.sh sets them for each pair of consecutive majors it is given). Without
# them it is skipped. Debian's PostgreSQL 15 cannot be the old side: its build stores a
# pg_attribute option that stock newer servers refuse in pg_upgrade.
use strict;
use warnings;
use File::Temp qw(tempdir);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my ($old_path, $new_path) = ($ENV{IDEM_UPGRADE_OLD}, $ENV{IDEM_UPGRADE_NEW});
plan skip_all => 'set IDEM_UPGRADE_OLD and IDEM_UPGRADE_NEW to two installations'
  unless $old_path && $new_path && -x "$old_path/bin/pg_upgrade" && -x "$new_path/bin/pg_upgrade";

my $preload = qq{shared_preload_libraries = 'idempotency'
idempotency.cleanup_interval = '1s'};

my $old = PostgreSQL::Test::Cluster->new('old', install_path => $old_path);
$old->init;
$old->append_conf('postgresql.conf', $preload);
$old->start;
$old->safe_psql('postgres', q{
  CREATE ROLE app LOGIN;
  CREATE DATABASE shop;
});
$old->safe_psql('shop', q{
  CREATE EXTENSION idempotency;
  GRANT USAGE ON SCHEMA idempotency TO app;
  CREATE TABLE tokens (k text PRIMARY KEY, t uuid);
  GRANT ALL ON tokens TO app;
  SET ROLE app;
  -- completed
  INSERT INTO tokens SELECT 'done-' || g,
    (idempotency.claim_key('done-' || g, idempotency.request_fingerprint(g::text), 'pay')).token
    FROM generate_series(1, 200) g;
  SELECT idempotency.complete_key(k, t, jsonb_build_object('k', k), 201, 'pay') FROM tokens WHERE k LIKE 'done-%';
  -- processing with a long lease; checkpointed
  INSERT INTO tokens SELECT 'held-' || g, (idempotency.claim_key('held-' || g, NULL, 'pay', lease => '1 day')).token
    FROM generate_series(1, 50) g;
  SELECT idempotency.checkpoint_key(k, t, 'step-1', 'pay') FROM tokens WHERE k LIKE 'held-%';
  -- released
  INSERT INTO tokens SELECT 'free-' || g, (idempotency.claim_key('free-' || g, NULL, 'pay')).token
    FROM generate_series(1, 20) g;
  SELECT idempotency.release_key(k, t, 'pay') FROM tokens WHERE k LIKE 'free-%';
  -- expired (deleted by the worker after the upgrade, or before: either is right)
  SELECT idempotency.claim_key('gone-' || g, NULL, 'pay', ttl => '2 seconds', lease => '2 seconds')
    FROM generate_series(1, 30) g;
});
my $before = $old->safe_psql('shop', q{
  SELECT string_agg(concat_ws('|', owner, scope, key, status, fingerprint, attempts, ttl, lease,
                              created_at, expires_at, lease_token, locked_until, recovery_point,
                              response_code, response), E'\n' ORDER BY key)
    FROM idempotency.idempotency_keys WHERE key NOT LIKE 'gone-%'});
$old->stop;

my $new = PostgreSQL::Test::Cluster->new('new', install_path => $new_path);
# 18's initdb turns data checksums on by default; pg_upgrade needs both sides alike, so the
# new side has them off only when the old side is older than 18.
$new->init($old->pg_version < 18 && $new->pg_version >= 18 ? (extra => ['--no-data-checksums']) : ());
$new->append_conf('postgresql.conf', $preload);

my $work = tempdir(CLEANUP => 1);
command_ok(
  [
    "$new_path/bin/pg_upgrade", '--no-sync',
    '-d', $old->data_dir, '-D', $new->data_dir,
    '-b', "$old_path/bin", '-B', "$new_path/bin",
    '-s', $new->host, '-p', $old->port, '-P', $new->port,
  ],
  'pg_upgrade from ' . $old->pg_version . ' to ' . $new->pg_version);
$new->start;

my $after = $new->safe_psql('shop', q{
  SELECT string_agg(concat_ws('|', owner, scope, key, status, fingerprint, attempts, ttl, lease,
                              created_at, expires_at, lease_token, locked_until, recovery_point,
                              response_code, response), E'\n' ORDER BY key)
    FROM idempotency.idempotency_keys WHERE key NOT LIKE 'gone-%'});
is($after, $before, 'every key kept its owner, state, token, fingerprint, lease and expiry');

is($new->safe_psql('shop', q{SET ROLE app;
  SELECT string_agg(DISTINCT status::text || ':' || response_code, ',')
    FROM tokens, LATERAL idempotency.claim_key(k, idempotency.request_fingerprint(substr(k, 6)), 'pay')
   WHERE k LIKE 'done-%'}), 'replay:201', 'completed keys replay their responses');
is($new->safe_psql('shop', q{SET ROLE app;
  SELECT string_agg(DISTINCT status::text, ',') FROM tokens, LATERAL idempotency.claim_key(k, NULL, 'pay')
   WHERE k LIKE 'held-%'}), 'in_progress', 'held keys are in_progress');
is($new->safe_psql('shop', q{SET ROLE app;
  SELECT string_agg(DISTINCT status::text || ':' || (recovery_point IS NULL)::text, ',')
    FROM tokens, LATERAL idempotency.claim_key(k, NULL, 'pay') WHERE k LIKE 'free-%'}),
  'reclaimed:true', 'released keys are reclaimed');
is($new->safe_psql('shop', q{SET ROLE app;
  SELECT count(*) FROM tokens, LATERAL idempotency.complete_key(k, t, '{"late": true}', 200, 'pay')
   WHERE k LIKE 'held-%'}), '50', "the holders' tokens from before the upgrade complete their keys");
ok($new->poll_query_until('shop',
    q{SELECT count(*) = 0 FROM idempotency.idempotency_keys WHERE key LIKE 'gone-%'}),
  'the cleanup worker deletes the expired keys on the new server');
is($new->safe_psql('shop', q{SET ROLE app; SELECT status FROM idempotency.claim_key('new-after-upgrade')}),
  'claimed', 'a new key is claimed');

$new->stop;
unlike(slurp_file($new->logfile), qr/terminated by signal/, 'no crash on the new server');
done_testing();
