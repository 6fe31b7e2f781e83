# A key of a dropped role that another transaction holds locked when the cleanup's pass over
# such keys reaches it is skipped (FOR UPDATE SKIP LOCKED: the cleanup never waits), and the
# pass is then not complete: it is made again in the next round, which deletes the key once
# the lock is gone. (A pass counted as done would leave the key until the next role change,
# and a role created under the old name would receive it.) The pass is made of several
# batches (a batch size of 32 keys reads one page a batch, and keys of a live role fill more
# pages after the locked key's): a later batch that skips nothing must not make the pass
# forget the skip of an earlier one. The verdicts wait for cleanup rounds, counted in
# idempotency_stats: no sleeps.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('orphan_pass_locked');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.cleanup_interval = '100ms'
idempotency.cleanup_batch_size = 32
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');

sub stat_of {
  my ($column) = @_;
  return $node->safe_psql('postgres',
    "SELECT coalesce(max($column), 0) FROM idempotency.idempotency_stats WHERE datname = 'postgres'");
}
# Waits for `n` more cleanup rounds of the database (each one after the launcher woke, read
# the catalogs, and so learned of every role change committed before).
sub more_rounds {
  my ($n) = @_;
  my $runs = stat_of('cleanup_runs');
  return $node->poll_query_until('postgres',
    "SELECT cleanup_runs >= $runs + $n FROM idempotency.idempotency_stats WHERE datname = 'postgres'");
}
sub ghost_keys {
  return $node->safe_psql('postgres',
    q{SELECT count(*) FROM idempotency.idempotency_keys WHERE owner = 'ghost'});
}

ok(more_rounds(1), 'the worker runs rounds');
$node->safe_psql('postgres', q{
  CREATE ROLE ghost;
  INSERT INTO idempotency.idempotency_keys
      (owner, scope, key, attempts, ttl, lease, created_at, expires_at, updated_at, status)
    VALUES ('ghost', '', 'held', 1, '1 hour', '1 min', now(), now() + interval '1 hour', now(),
            'completed');
  -- Keys of a live role after it, on the next pages: the pass's later batches skip nothing.
  INSERT INTO idempotency.idempotency_keys
      (owner, scope, key, attempts, ttl, lease, created_at, expires_at, updated_at, status,
       response)
    SELECT current_user, '', 'live-' || g, 1, '1 hour', '1 min', now(), now() + interval '1 hour',
           now(), 'completed', jsonb_build_object('padding', repeat('x', 200))
      FROM generate_series(1, 200) g;
});
cmp_ok($node->safe_psql('postgres',
    q{SELECT pg_relation_size('idempotency.idempotency_keys') / current_setting('block_size')::int}),
  '>=', 3, 'the keys fill several pages: the pass over them takes several batches');
is($node->safe_psql('postgres',
    q{SELECT (ctid::text::point)[0] FROM idempotency.idempotency_keys WHERE key = 'held'}),
  '0', 'the locked key is on the first page: the first batch skips it');
my $locker = $node->background_psql('postgres');
$locker->query_safe(q{BEGIN; SELECT key FROM idempotency.idempotency_keys WHERE owner = 'ghost' FOR UPDATE});
$node->safe_psql('postgres', 'DROP ROLE ghost');
my $passes = stat_of('orphan_passes');
ok(more_rounds(3), 'rounds go on while the key of the dropped role is locked');
is(ghost_keys(), '1', 'the locked key is skipped, not waited for');
is(stat_of('orphan_passes'), $passes, 'and the pass that skipped it is not counted as done');

$locker->query_safe('COMMIT');
$locker->quit;
ok(more_rounds(3), 'after the lock is gone, more rounds');
is(ghost_keys(), '0', 'the pass is made again and deletes the key of the dropped role');
is($node->safe_psql('postgres', q{SELECT count(*) FROM idempotency.idempotency_keys WHERE key LIKE 'live-%'}),
  '200', 'and no key of the live role');
cmp_ok(stat_of('orphan_passes'), '>', $passes, 'and that pass is counted as done');

$node->stop;
done_testing();
