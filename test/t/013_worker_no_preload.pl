# Without shared_preload_libraries: no worker, idempotency_cleanup() still works (the
# pg_cron way), and idempotency_stats answers with one row that says what is missing.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('no_preload');
$node->init;
# Overrides the preloading that the test configuration (TEMP_CONFIG) may add.
$node->append_conf('postgresql.conf', q{shared_preload_libraries = ''});
$node->start;

is($node->safe_psql('postgres', 'SHOW shared_preload_libraries'), '', 'not preloaded');
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');
is($node->safe_psql('postgres', q{
    SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'idempotency%'}),
  '0', 'no cleanup launcher without preloading');

is($node->safe_psql('postgres', q{SELECT status FROM claim_key('k1')}), 'claimed',
  'claim_key works');
$node->safe_psql('postgres', q{
  INSERT INTO idempotency_keys (key, owner, ttl, lease, created_at, expires_at, updated_at)
  SELECT 'old' || g, current_user, '1 hour', '5 min', now() - interval '2 hours', now() - interval '1 hour', now()
    FROM generate_series(1, 300) g});
is($node->safe_psql('postgres', 'SELECT idempotency_cleanup(100)'), '300',
  'idempotency_cleanup deletes the expired keys on demand');
is($node->safe_psql('postgres', 'SELECT count(*) FROM idempotency_keys'), '1',
  'the live key stays');

is($node->safe_psql('postgres', q{
    SELECT datname, shared_memory, claimed IS NULL, cleanup_runs IS NULL, note
      FROM idempotency_stats}),
  "postgres|f|t|t|statistics need shared_preload_libraries = 'idempotency' (and a restart)",
  'idempotency_stats answers with one row and a note; counters are NULL, not 0');

$node->stop;
done_testing();
