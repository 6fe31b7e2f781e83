# Cost and memory of the cleanup do not grow with the number of roles that own keys when no
# role was dropped (issue #21, item 5): with 10,000 owners of 10 keys each, a round that
# follows no change of pg_authid makes no pass over the keys of dropped roles and needs the
# memory a round with one owner needs; a CREATE ROLE makes one pass due, a DROP ROLE gets the
# role's keys deleted by the next round. idempotency_cleanup() works in its own worker: the
# calling backend's memory does not grow either.
#
# Each round's duration and peak memory (palloc'd, measured before every batch's SPI memory is
# freed) come from the worker's DEBUG1 line; the figures are printed (diag) for the record.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use List::Util qw(max);

my $node = PostgreSQL::Test::Cluster->new('cleanup_owners');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.cleanup_interval = '200ms'
log_min_messages = debug1
});
$node->start;
$node->safe_psql('postgres', 'CREATE DATABASE app');
$node->safe_psql('app', 'CREATE EXTENSION idempotency');
my $app = $node->safe_psql('postgres', q{SELECT oid FROM pg_database WHERE datname = 'app'});

sub stat_of {
  my ($column) = @_;
  return $node->safe_psql('app',
    "SELECT $column FROM idempotency.idempotency_stats WHERE datname = 'app'");
}

# The round lines of database app logged after byte $offset: [ms, deleted, pass, memory].
sub rounds_since {
  my ($offset) = @_;
  my $log = substr(slurp_file($node->logfile), $offset);
  my @rounds;
  while ($log =~ /idempotency cleanup of database $app: round of (\d+) ms, (\d+) keys deleted, orphan pass (yes|no), peak memory (\d+) bytes/g) {
    push @rounds, [ $1, $2, $3, $4 ];
  }
  return @rounds;
}

# Waits for $n more rounds of app (counted in idempotency_stats) and returns their lines.
sub next_rounds {
  my ($n) = @_;
  my $offset = -s $node->logfile;
  my $runs = stat_of('cleanup_runs') || 0;
  $node->poll_query_until('app', qq{
    SELECT cleanup_runs >= $runs + $n FROM idempotency.idempotency_stats WHERE datname = 'app'})
    or diag("fewer than $n rounds");
  # The DEBUG1 line follows the statistics by a moment: wait until they are all in the log.
  for (1 .. 500) {
    last if scalar(rounds_since($offset)) >= $n;
    select(undef, undef, undef, 0.01);
  }
  return rounds_since($offset);
}

sub describe {
  my @rounds = @_;
  return join(', ', map { "$_->[0] ms/$_->[3] B" } @rounds);
}

sub add_keys {
  my ($first, $last) = @_;
  $node->safe_psql('app', qq{
    INSERT INTO idempotency.idempotency_keys (key, owner, ttl, lease, created_at, expires_at, updated_at)
    SELECT 'k' || i || '-' || j, 'own' || i, '1 hour', '5 min', now(), now() + interval '1 hour', now()
      FROM generate_series($first, $last) i, generate_series(1, 10) j});
}

# --- one owner ---------------------------------------------------------------------------
$node->safe_psql('postgres', 'CREATE ROLE own1');
add_keys(1, 1);
next_rounds(2);    # the pass that CREATE ROLE made due, and one more
my @one = grep { $_->[2] eq 'no' } next_rounds(5);
cmp_ok(scalar(@one), '>=', 5, 'rounds with one owner and no role changed make no pass');
my $one_memory = max(map { $_->[3] } @one);
diag('1 owner, 10 keys: ' . describe(@one));

# --- 10,000 owners -----------------------------------------------------------------------
my $passes = stat_of('orphan_passes');
$node->safe_psql('postgres', q{
  DO $$ BEGIN
    FOR i IN 2 .. 10000 LOOP EXECUTE format('CREATE ROLE %I', 'own' || i); END LOOP;
  END $$});
add_keys(2, 10000);
is($node->safe_psql('app', 'SELECT count(DISTINCT owner) FROM idempotency.idempotency_keys'),
  '10000', '10,000 roles own 10 keys each');
ok($node->poll_query_until('app', qq{
    SELECT orphan_passes > $passes FROM idempotency.idempotency_stats WHERE datname = 'app'}),
  'the CREATE ROLEs made one pass due');
my @settled = next_rounds(2);
diag('right after the pass: ' . describe(@settled));
$passes = stat_of('orphan_passes');
my @many = next_rounds(5);
is(scalar(grep { $_->[2] eq 'yes' } @many), 0, 'rounds with no role changed make no pass');
is(stat_of('orphan_passes'), $passes, 'orphan_passes stands still');
my $many_memory = max(map { $_->[3] } @many);
diag('10,000 owners, 100,000 keys: ' . describe(@many));
# The same statements on the same plans: the same memory, give or take an allocator block.
cmp_ok($many_memory, '<=', $one_memory + 64 * 1024,
  "a round's peak memory does not grow with the owners ($one_memory B with 1, $many_memory B with 10,000)");

# --- idempotency_cleanup() ----------------------------------------------------------------
# The first call of a session loads the function and the catalog entries it looks at; the
# second shows what a call costs the caller.
my $offset = -s $node->logfile;
# (Every measurement is the same statement, so that its own memory is the same in each, and
# nothing else runs between them; the time is taken by another session.)
my $call = $node->safe_psql('app', q{
  SELECT sum(total_bytes) AS m0 FROM pg_backend_memory_contexts \gset
  SELECT idempotency.idempotency_cleanup() AS first \gset
  SELECT sum(total_bytes) AS m1 FROM pg_backend_memory_contexts \gset
  SELECT idempotency.idempotency_cleanup() AS deleted \gset
  SELECT sum(total_bytes) AS m2 FROM pg_backend_memory_contexts \gset
  SELECT :'deleted', :m1 - :m0, :m2 - :m1,
         (SELECT regexp_replace(l, '\D', '', 'g')
            FROM regexp_split_to_table(pg_read_file('/proc/' || pg_backend_pid() || '/status'), '\n') l
           WHERE l LIKE 'VmHWM%')});
my ($deleted, $first_growth, $growth, $hwm) = split /\|/, $call;
my $call_ms = $node->safe_psql('app', q{
  SELECT clock_timestamp() AS t0 \gset
  SELECT idempotency.idempotency_cleanup() AS n \gset
  SELECT round(extract(epoch FROM clock_timestamp() - :'t0') * 1000, 1)});
is($deleted, '0', 'idempotency_cleanup() with 10,000 owners and none dropped deletes nothing');
my @lines = substr(slurp_file($node->logfile), $offset) =~ /(idempotency_cleanup\(\) of backend \d+: .*)/g;
shift @lines;  # the first call's
diag("idempotency_cleanup(): $call_ms ms in the caller; backend memory +$first_growth B at the "
    . "first call, +$growth B at the second; backend peak RSS $hwm kB; its worker: "
    . ($lines[-1] // '?'));
is(scalar(grep { /orphan pass no/ } @lines), 2, 'its worker made no pass either');
cmp_ok($growth, '<', 16 * 1024, 'a call costs the calling backend no memory (the work is in the worker)');

# --- DROP ROLE ---------------------------------------------------------------------------
# The pass reads the table in ranges of blocks (TID range scans, which pg_stat_user_tables
# does not count as sequential scans), never a whole table per batch. Only the view is
# read until the pass's round and the next one are over (its statistics are flushed when
# its worker exits, before the launcher starts the next).
my $seq_scans = $node->safe_psql('app', q{
  SELECT seq_scan FROM pg_stat_user_tables WHERE relid = 'idempotency.idempotency_keys'::regclass});
$passes = stat_of('orphan_passes');
$offset = -s $node->logfile;
$node->safe_psql('postgres', 'DROP ROLE own5');
ok($node->poll_query_until('app', qq{
    SELECT orphan_passes > $passes FROM idempotency.idempotency_stats WHERE datname = 'app'}),
  'DROP ROLE makes a pass due, which the next round makes');
next_rounds(2);
is($node->safe_psql('app', q{
    SELECT seq_scan FROM pg_stat_user_tables WHERE relid = 'idempotency.idempotency_keys'::regclass}),
  $seq_scans, 'without a sequential scan of the key table');
is($node->safe_psql('app', q{SELECT count(*) FROM idempotency.idempotency_keys WHERE owner = 'own5'}),
  '0', "the dropped role's keys are deleted");
is($node->safe_psql('app', 'SELECT count(*) FROM idempotency.idempotency_keys'), '99990',
  "and only the dropped role's");
my ($pass) = grep { $_->[2] eq 'yes' } rounds_since($offset);
diag('the pass over 100,000 keys with 10,000 owners: '
    . ($pass ? "$pass->[0] ms, $pass->[1] keys deleted, peak memory $pass->[3] B" : '?'));

$node->stop;
done_testing();
