# On a hot standby the cleanup worker does nothing (it has nothing it could delete); after
# promotion it starts and deletes the expired keys it inherited.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $primary = PostgreSQL::Test::Cluster->new('primary');
$primary->init(allows_streaming => 1);
# The primary's worker serves no database here, so that the expired keys reach the
# standby untouched.
$primary->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.cleanup_interval = '100ms'
idempotency.databases = 'no_such_database'
});
$primary->start;
$primary->safe_psql('postgres', 'CREATE DATABASE app');
$primary->safe_psql('app', 'CREATE EXTENSION idempotency');
$primary->safe_psql('app', q{
  INSERT INTO idempotency_keys (key, owner, ttl, lease, created_at, expires_at, updated_at)
  SELECT 'old' || g, current_user, '1 hour', '5 min', now() - interval '2 hours', now() - interval '1 hour', now()
    FROM generate_series(1, 1000) g;
  INSERT INTO idempotency_keys (key, owner, ttl, lease, created_at, expires_at, updated_at)
  SELECT 'live' || g, current_user, '1 hour', '5 min', now(), now() + interval '1 hour', now()
    FROM generate_series(1, 10) g});

$primary->backup('backup');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'backup', has_streaming => 1);
# The standby serves every database (the setting would let it clean 'app').
$standby->append_conf('postgresql.conf', q{idempotency.databases = ''});
$standby->start;
$primary->wait_for_catchup($standby);

is($standby->safe_psql('app', 'SELECT pg_is_in_recovery()'), 't', 'the standby is in recovery');
is($standby->safe_psql('app', q{SELECT count(*) FROM idempotency_keys WHERE key LIKE 'old%'}),
  '1000', 'the standby has the expired keys');
# Enough time for many 100 ms intervals on a running launcher (an observation window).
$standby->safe_psql('postgres', 'SELECT pg_sleep(1)');
is($standby->safe_psql('postgres', q{
    SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'idempotency cleanup%'}),
  '0', 'no launcher or cleanup worker runs on the standby');
is($standby->safe_psql('app', q{
    SELECT coalesce(sum(cleanup_runs), 0) FROM idempotency_stats}),
  '0', 'no cleanup round ran on the standby');
ok(!$standby->log_contains(qr/idempotency cleanup.*(failed|ERROR)/),
  'and no failed attempt is logged');

$standby->promote;
ok($standby->poll_query_until('postgres', q{
    SELECT count(*) = 1 FROM pg_stat_activity
     WHERE backend_type = 'idempotency cleanup launcher'}),
  'after promotion the launcher starts');
ok($standby->poll_query_until('app', q{
    SELECT count(*) = 0 FROM idempotency_keys WHERE key LIKE 'old%'}),
  'and deletes the expired keys');
is($standby->safe_psql('app', q{SELECT count(*) FROM idempotency_keys WHERE key LIKE 'live%'}),
  '10', 'live keys stay');
is($primary->safe_psql('app', q{SELECT count(*) FROM idempotency_keys WHERE key LIKE 'old%'}),
  '1000', 'the old primary (serving no database) kept its expired keys: the setting works');

$standby->stop;
$primary->stop;
done_testing();
