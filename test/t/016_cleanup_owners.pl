# Cost and memory of the cleanup do not grow with the number of roles that own keys when no
# role was dropped (issue #21, item 5): with 10,000 owners of 10 keys each, a round or an
# idempotency_cleanup() that follows no change of pg_authid makes no pass over the keys of
# dropped roles and needs the memory it needs with 100 owners; a CREATE ROLE makes no pass due (it cannot
# orphan a key, issue #32), a DROP ROLE gets the
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
    INSERT INTO idempotency.idempotency_keys (key, owner, ttl, lease, created_at, expires_at, updated_at,
                                              owner_oid, owner_system)
    SELECT 'k' || i || '-' || j, 'own' || i, '1 hour', '5 min', now(), now() + interval '1 hour', now(),
           ('own' || i)::regrole, (SELECT system_identifier FROM pg_control_system())
      FROM generate_series($first, $last) i, generate_series(1, 10) j});
}

# One idempotency_cleanup() as the caller sees it: [deleted, the caller backend's memory
# growth by the call in bytes, its time in ms (taken by another session), the DEBUG1 line of
# its worker]. The first call of a session loads the function and the catalog entries it
# looks at; the second shows what a call costs the caller. (Every memory measurement is the
# same statement, so that its own memory is the same in each, and nothing else runs between
# them.)
sub measure_call {
  my $offset = -s $node->logfile;
  my $call = $node->safe_psql('app', q{
    SELECT sum(total_bytes) AS m0 FROM pg_backend_memory_contexts \gset
    SELECT idempotency.idempotency_cleanup() AS first \gset
    SELECT sum(total_bytes) AS m1 FROM pg_backend_memory_contexts \gset
    SELECT idempotency.idempotency_cleanup() AS deleted \gset
    SELECT sum(total_bytes) AS m2 FROM pg_backend_memory_contexts \gset
    SELECT :'deleted', :m2 - :m1});
  my ($deleted, $growth) = split /\|/, $call;
  my $ms = $node->safe_psql('app', q{
    SELECT clock_timestamp() AS t0 \gset
    SELECT idempotency.idempotency_cleanup() AS n \gset
    SELECT round(extract(epoch FROM clock_timestamp() - :'t0') * 1000, 1)});
  my (@lines, @peaks);
  for (1 .. 500) {
    my $log = substr(slurp_file($node->logfile), $offset);
    (@lines, @peaks) = ();
    while ($log =~ /idempotency_cleanup\(\) of backend \d+: (\d+ ms, .*?, peak memory (\d+) bytes)/g) {
      push @lines, $1;
      push @peaks, $2;
    }
    last if @lines >= 3;
    select(undef, undef, undef, 0.01);
  }
  return [ $deleted, $growth, $ms, \@lines, \@peaks ];
}

# Waits for the rounds that the last role change made due and returns their lines: until a
# round makes no pass. A pass that met keys of an INSERT not yet committed skipped them and is
# made again in the next round (cleanup.cpp), as often as a round overlaps the INSERT, and a
# pass that overlaps an INSERT is slowed by the throttle (another session works): how many
# rounds that takes depends on the machine, not on the code under test.
sub settle {
  my @rounds = next_rounds(1);
  for (1 .. 50) {
    last if $rounds[-1][2] eq 'no';
    push @rounds, next_rounds(1);
  }
  return @rounds;
}

sub mb { return sprintf('%.2f MB', $_[0] / 1024 / 1024); }

# --- 100 owners --------------------------------------------------------------------------
$node->safe_psql('postgres', q{
  DO $$ BEGIN
    FOR i IN 1 .. 100 LOOP EXECUTE format('CREATE ROLE %I', 'own' || i); END LOOP;
  END $$});
add_keys(1, 100);
settle();    # the pass that the CREATE ROLEs made due
my @few = grep { $_->[2] eq 'no' } next_rounds(5);
cmp_ok(scalar(@few), '>=', 5, 'rounds with 100 owners and no role changed make no pass');
my $few_memory = max(map { $_->[3] } @few);
diag('rounds with 100 owners, 1,000 keys: ' . describe(@few));
my $few_call = measure_call();

# --- 10,000 owners -----------------------------------------------------------------------
my $passes = stat_of('orphan_passes');
$node->safe_psql('postgres', q{
  DO $$ BEGIN
    FOR i IN 101 .. 10000 LOOP EXECUTE format('CREATE ROLE %I', 'own' || i); END LOOP;
  END $$});
add_keys(101, 10000);
is($node->safe_psql('app', 'SELECT count(DISTINCT owner) FROM idempotency.idempotency_keys'),
  '10000', '10,000 roles own 10 keys each');
next_rounds(3);
is(stat_of('orphan_passes'), $passes, 'the CREATE ROLEs make no pass due');
my @settled = settle();
diag('right after the pass: ' . describe(@settled));
$passes = stat_of('orphan_passes');
my @many = next_rounds(5);
is(scalar(grep { $_->[2] eq 'yes' } @many), 0, 'rounds with no role changed make no pass');
is(stat_of('orphan_passes'), $passes, 'orphan_passes stands still');
my $many_memory = max(map { $_->[3] } @many);
diag('rounds with 10,000 owners, 100,000 keys: ' . describe(@many));
# The same statements on the same plans: the same memory, give or take an allocator block.
cmp_ok($many_memory, '<=', $few_memory + 64 * 1024,
  "a round's peak memory does not grow with the owners ($few_memory B with 100, $many_memory B with 10,000)");

# --- idempotency_cleanup() with 100 and with 10,000 owners --------------------------------
my $many_call = measure_call();
for my $case ([ '100', $few_call ], [ '10,000', $many_call ]) {
  my ($owners, $call) = @$case;
  my ($deleted, $growth, $ms, $worker_lines, $peaks) = @$call;
  diag("idempotency_cleanup() with $owners owners: $ms ms in the caller, caller backend memory "
      . "+$growth B; its worker: " . ($worker_lines->[-1] // '?') . ' (' . mb(max(@$peaks) // 0)
      . ' peak)');
  is($deleted, '0', "idempotency_cleanup() with $owners owners and none dropped deletes nothing");
  is(scalar(@$worker_lines), 3, "its worker logged each of the three calls ($owners owners)");
  is(scalar(grep { /orphan pass no/ } @$worker_lines), 3,
    "its worker made no pass over the keys of dropped roles ($owners owners)");
  cmp_ok($growth, '<', 16 * 1024,
    "a call costs the calling backend no memory: the work is in the worker ($owners owners)");
}
my $few_peak = max(@{ $few_call->[4] }) // 0;
my $many_peak = max(@{ $many_call->[4] }) // 0;
cmp_ok($many_peak, '<=', $few_peak + 64 * 1024,
  "the call's worker needs the same memory with 10,000 owners as with 100 ($few_peak B, $many_peak B)");

# --- DROP ROLE ---------------------------------------------------------------------------
# The pass reads the table in ranges of blocks (TID range scans, which pg_stat_user_tables
# does not count as sequential scans), never a whole table per batch. Only the view is
# read until the pass's round and the next one are over (its statistics are flushed when
# its worker exits, before the launcher starts the next).
my $seq_scans = $node->safe_psql('app', q{
  SELECT seq_scan FROM pg_stat_user_tables WHERE relid = 'idempotency.idempotency_keys'::regclass});
$passes = stat_of('orphan_passes');
my $offset = -s $node->logfile;
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
