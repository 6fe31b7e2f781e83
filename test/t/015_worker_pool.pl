# A full max_worker_processes pool (issue #21, item 8): the launcher's failed starts are a
# WARNING at most once a minute, counted per database in idempotency_stats
# (worker_start_failures, last_start_failure); idempotency_cleanup() refuses with 53400 and
# counts too. With slots to spare again, cleanup goes on.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $node = PostgreSQL::Test::Cluster->new('worker_pool');
$node->init;
# One slot, which the launcher itself takes (no logical replication launcher either).
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.cleanup_interval = '100ms'
max_worker_processes = 1
max_logical_replication_workers = 0
});
$node->start;
my $started = time();
$node->safe_psql('postgres', 'CREATE DATABASE app');
$node->safe_psql('app', q{
  CREATE EXTENSION idempotency;
  INSERT INTO idempotency.idempotency_keys (key, owner, ttl, lease, created_at, expires_at, updated_at)
  SELECT 'old' || g, current_user, '1 hour', '5 min', now() - interval '2 hours', now() - interval '1 hour', now()
    FROM generate_series(1, 20) g});

sub failures {
  return $node->safe_psql('app', q{
    SELECT coalesce(max(worker_start_failures), 0) FROM idempotency.idempotency_stats WHERE datname = 'app'});
}

# The launcher retries a failed start after a second.
ok($node->poll_query_until('app', q{
    SELECT worker_start_failures >= 3 AND last_start_failure IS NOT NULL
      FROM idempotency.idempotency_stats WHERE datname = 'app'}),
  'failed starts of the database worker are counted in idempotency_stats');
my $warnings = () = slurp_file($node->logfile) =~
  /WARNING:  idempotency cleanup: no free background worker slot to clean database \d+/g;
my $minutes = int((time() - $started) / 60);
cmp_ok($warnings, '>=', 1, 'a full pool is a WARNING');
cmp_ok($warnings, '<=', 1 + $minutes,
  sprintf('at most one a minute (%d warnings for %d failed starts)', $warnings, failures()));
ok($node->log_contains(qr/DETAIL:  \d+ start\(s\) failed since the last warning, \d+ database\(s\) wait; max_worker_processes is 1\./),
  'the WARNING says how many failed and the setting to raise');
is($node->safe_psql('app', 'SELECT count(*) FROM idempotency.idempotency_keys'), '20',
  'no key was deleted');

# idempotency_cleanup() needs a slot too.
my $before = failures();
my ($rc, $out, $err) = $node->psql('app', q{
  \set VERBOSITY verbose
  SELECT idempotency.idempotency_cleanup()});
isnt($rc, 0, 'idempotency_cleanup() fails');
like($err, qr/ERROR:  53400: idempotency_cleanup\(\) found no free background worker slot/,
  'with 53400 and a clear message') or diag($err);
like($err, qr/HINT:  .*max_worker_processes/, 'and a hint');
cmp_ok(failures(), '>', $before, 'and is counted');
is($node->safe_psql('app', 'SELECT count(*) FROM idempotency.idempotency_keys'), '20',
  'having deleted nothing');

# Slots to spare again.
$node->append_conf('postgresql.conf', 'max_worker_processes = 8');
$node->restart;
ok($node->poll_query_until('app', 'SELECT count(*) = 0 FROM idempotency.idempotency_keys'),
  'with free slots the worker deletes the keys');
is($node->safe_psql('app', q{
    SELECT worker_start_failures FROM idempotency.idempotency_stats WHERE datname = 'app'}),
  '0', 'and no start fails (the counters start again with the server)');
$node->stop;
done_testing();
