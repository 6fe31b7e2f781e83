# The cleanup's throttle (src/cleanup_throttle.hpp) decides as configured: checked from its
# decisions, which it logs at DEBUG2 for every batch ("batch of N keys, cost C, other sessions
# working|idle, pause P ms"), never from how fast the machine is. With
# idempotency.cleanup_cost_limit = 400 and cleanup_delay = 20ms, for idempotency_cleanup(1000):
#   - nobody else works (its own caller does not count): batches of 1000 keys without pause,
#     but the first, sized before any look as a busy one (400 / 4 = 100 keys);
#   - another session of the database holds a snapshot, or another database commits
#     transactions: every batch is cut to what the budget buys at the last batch's cost per key,
#     followed by a pause of 20 ms x cost / 400 (vacuum_delay_point's rule), and the call lasts
#     at least as long as its pauses together (they are slept, whole).
use strict;
use warnings;
use POSIX qw(floor ceil);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my ($limit, $delay, $batch) = (400, 20, 1000);
my $node = PostgreSQL::Test::Cluster->new('cleanup_throttle');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempotency'
idempotency.cleanup_cost_limit = $limit
idempotency.cleanup_delay = '${delay}ms'
# The CPU share's pauses are checked at the end (off until then, as by default: the pauses
# checked first are the budget's alone).
idempotency.cleanup_cpu_share = 100
log_min_messages = debug2
# Nobody but the test's sessions holds a snapshot in its databases: no autovacuum (an ANALYZE
# holds one), and the background worker serves only postgres.
autovacuum = off
idempotency.databases = 'postgres'
});
$node->start;
$node->safe_psql('postgres', 'CREATE DATABASE app');
$node->safe_psql('postgres', 'CREATE DATABASE other');
# The calls below are the only deleters. A first call on the empty table makes the pass over
# keys of dropped roles, which the calls below then skip.
$node->safe_psql('app', q{
  CREATE EXTENSION idempotency;
  SELECT idempotency.idempotency_cleanup()});
$node->safe_psql('other', 'CREATE TABLE writes (n int)');

sub fill {
  my ($n) = @_;
  $node->safe_psql('app', qq{
    INSERT INTO idempotency.idempotency_keys (key, owner, ttl, lease, created_at, expires_at, updated_at)
    SELECT 'old' || g, current_user, '1 hour', '5 min', now() - interval '2 hours',
           now() - interval '1 hour' + g * interval '1 us', now()
      FROM generate_series(1, $n) g});
}

# Runs idempotency_cleanup($batch) on $n expired keys; returns its batches ([keys, cost, busy,
# pause] each, in order) and its worker's summary (ms, pauses, paused ms).
sub call {
  my ($n) = @_;
  fill($n);
  my $offset = -s $node->logfile;
  is($node->safe_psql('app', "SELECT idempotency.idempotency_cleanup($batch)"), $n, "the call deletes the $n keys");
  my $log = slurp_file($node->logfile, $offset);
  my @batches;
  while ($log =~ /idempotency cleanup: batch of (\d+) keys, cost (\d+), other sessions (working|idle), pause (\d+) ms/g) {
    push @batches, [ $1, $2, $3 eq 'working', $4 ];
  }
  my @summary = $log =~ /idempotency_cleanup\(\) of backend \d+: (\d+) ms, .* (\d+) pauses of (\d+) ms in all/;
  return (\@batches, \@summary);
}

# The pause after a batch of cost $cost while others work, and the keys the next batch may take
# after a batch of $keys keys that cost $cost (what the budget buys, at most $batch; the
# division in floating point may land one below the exact one).
sub pause_for { my ($cost) = @_; return $cost > 0 ? (ceil($delay * $cost / $limit) > 1000 ? 1000 : ceil($delay * $cost / $limit)) : 0; }
sub rows_after {
  my ($keys, $cost) = @_;
  my $rows = $cost > 0 ? floor($limit * $keys / $cost) : $batch;
  $rows = $batch if $rows > $batch;
  return $rows < 1 ? 1 : $rows;
}

# Checks the decisions of a call made while others work. With $from_sign, the batches before
# the first look that saw the others at work are left out (and their pauses, none, from the
# summary): the sign of a writer in another database is a transaction ID it took between two
# looks, and the first looks of a call come about a millisecond apart, when the scheduler of a
# loaded machine may not have run the writer yet. From that look on, the sign holds a second,
# and the writer keeps renewing it: every later batch must see it.
sub check_busy {
  my ($what, $all, $summary, $from_sign) = @_;
  my $batches = $all;
  if ($from_sign) {
    my ($first) = grep { $all->[$_][2] } 0 .. $#$all;
    ok(defined $first, "$what: a look saw the others at work");
    $first //= 0;
    diag("$what: $first batches before the first look that saw the writer") if $first > 0;
    $batches = [ @$all[ $first .. $#$all ] ];
  }
  ok(@$batches >= 10, "$what: the call ran in many batches (" . scalar(@$batches) . ')');
  is(scalar(grep { !$_->[2] } @$batches), 0, "$what: every batch saw the other sessions working");
  my @wrong_pause = grep { $_->[3] != pause_for($_->[1]) } @$batches;
  is(scalar(@wrong_pause), 0, "$what: every pause is $delay ms x cost / $limit")
    or diag(explain(\@wrong_pause));
  my @wrong_size;
  for my $i (1 .. $#$batches - 1) {  # the last batch takes what is left
    my ($keys, $cost) = @{ $batches->[$i - 1] };
    my $rows = rows_after($keys, $cost);
    push @wrong_size, [ $i, $batches->[$i][0], $rows ]
      unless $batches->[$i][0] <= $rows && $batches->[$i][0] >= $rows - 1;
  }
  is(scalar(@wrong_size), 0, "$what: every batch is what the budget buys at the last cost per key")
    or diag(explain(\@wrong_size));
  ok($all->[0][0] <= $limit, "$what: no batch of $batch keys (the first has $all->[0][0])");
  my ($ms, $pauses, $paused) = @$summary;
  my $sum = 0;
  $sum += $_->[3] for @$batches;
  is($paused, $sum, "$what: the summary counts the pauses' $sum ms");
  is($pauses, scalar(grep { $_->[3] > 0 } @$batches), "$what: and each pause");
  cmp_ok($ms, '>=', $sum, "$what: the call took at least its pauses ($ms ms >= $sum ms)");
}

# --- nobody else works --------------------------------------------------------------------
my ($batches, $summary) = call(20000);
is($batches->[0][0], $limit / 4, 'idle: the first batch, before any look, is what the budget buys at 4 per key');
is(scalar(grep { $_->[2] } @$batches), 0, 'idle: no batch saw other sessions working (the caller does not count)');
is(scalar(grep { $_->[3] != 0 } @$batches), 0, 'idle: no pause');
is(scalar(grep { $_->[0] != $batch } @$batches[ 1 .. $#$batches - 1 ]), 0, "idle: the others have $batch keys");
is($summary->[1], 0, 'idle: the summary counts no pause');
# Each batch's cost is its own (the buffer counters are read again at every batch's start):
# batches of the same size over the same kind of rows cost about the same, whatever came
# before. (Costs counted from the run's start would grow with every batch, and the busy
# calls below would then pace by them: batches of one key, pauses of a second.)
{
  my @full = map { $_->[1] } @$batches[ 1 .. $#$batches - 1 ];
  my ($least, $most) = (sort { $a <=> $b } @full)[ 0, -1 ];
  ok(@full >= 10 && $most <= 3 * $least,
    "idle: every full batch costs about the same (from $least to $most)")
    or BAIL_OUT('the batches\' costs are not their own: the busy calls would run for minutes');
}

# --- another session of the database holds a snapshot -------------------------------------
my $reader = $node->background_psql('app');
$reader->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ');
$reader->query_safe('SELECT count(*) FROM pg_class');
check_busy('a snapshot held in the database', call(5000));
$reader->query_safe('COMMIT');
$reader->quit;

# --- another database commits transactions ------------------------------------------------
my $writer = $node->background_psql('other');
# Without waiting for a WAL flush per commit: on a loaded machine a flush can take longer
# than a batch of the call, and a batch whose look comes before the writer's next commit
# would see nobody at work (the writer must commit between any two looks).
$writer->query_safe('SET synchronous_commit = off');
$writer->query_until(qr/writing/, q{\echo writing
DO $$
BEGIN
  FOR i IN 1 .. 1000000 LOOP
    INSERT INTO writes VALUES (i);
    COMMIT;
    EXIT WHEN EXISTS (SELECT FROM pg_stat_activity WHERE application_name = 'stop writing');
  END LOOP;
END $$;
});
$node->poll_query_until('other', 'SELECT count(*) > 100 FROM writes') or diag('the writer wrote nothing');
check_busy('transactions committed in another database', call(5000), 1);
$node->safe_psql('postgres', q{SET application_name = 'stop writing'; SELECT pg_sleep(0.5)});
$writer->quit;

# --- a light writer in another database ---------------------------------------------------
# One transaction about every 10 ms: a few between two looks of the cleanup. Each look counts
# the transaction IDs taken since the last one beyond the cleanup's own batches since then
# (one): a count of its own that grew with every batch would soon hide the writer, and the
# call would run its last batches at full size, without pause, beside it.
my $written = $node->safe_psql('other', 'SELECT count(*) FROM writes');
my $light = $node->background_psql('other');
$light->query_safe('SET synchronous_commit = off');
$light->query_until(qr/writing/, q{\echo writing
DO $$
BEGIN
  FOR i IN 1 .. 1000000 LOOP
    INSERT INTO writes VALUES (i);
    COMMIT;
    EXIT WHEN EXISTS (SELECT FROM pg_stat_activity WHERE application_name = 'stop light writing');
    PERFORM pg_sleep(0.01);
  END LOOP;
END $$;
});
$node->poll_query_until('other', "SELECT count(*) > $written + 20 FROM writes")
  or diag('the light writer wrote nothing');
check_busy('a light writer in another database', call(20000), 1);
$node->safe_psql('postgres', q{SET application_name = 'stop light writing'; SELECT pg_sleep(0.5)});
$light->quit;

# --- the CPU share ------------------------------------------------------------------------
# While others work, the pause is also long enough that the process's CPU time since its last
# pause (logged per batch: "CPU since the last pause C us, pause for the CPU share S ms") is at
# most idempotency.cleanup_cpu_share percent: S = ceil(C x (100 - share) / share / 1000) ms, at
# most 1000, and the pause slept is the larger of S and the budget's; C counts the batch and
# the look after it, the first time from the run's start. At 1 percent with a delay of 1 ms, the CPU share sets the
# pauses (a batch's CPU, a transaction and a statement, is above 10 us: S >= 1 ms, and the
# budget's pause is 1 ms for a batch within the budget). Checked from the logged values, never
# from how fast the machine is.
my $share = 1;
$node->safe_psql('postgres', qq{
  ALTER SYSTEM SET idempotency.cleanup_cpu_share = $share;
  ALTER SYSTEM SET idempotency.cleanup_delay = '1ms';
  SELECT pg_reload_conf()});
$node->poll_query_until('postgres', 'SHOW idempotency.cleanup_cpu_share', $share)
  or diag('the new share was not loaded');
$reader = $node->background_psql('app');
$reader->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ');
$reader->query_safe('SELECT count(*) FROM pg_class');
fill(2000);
my $offset = -s $node->logfile;
is($node->safe_psql('app', "SELECT idempotency.idempotency_cleanup($batch)"), 2000,
  'CPU share: the call deletes the 2000 keys');
my $log = slurp_file($node->logfile, $offset);
my @cpu_batches;
while ($log =~ /batch of (\d+) keys, cost (\d+), other sessions (working|idle), pause (\d+) ms; took \d+ us, (\d+) us on CPU; .*; CPU since the last pause (\d+) us, pause for the CPU share (\d+) ms/g) {
  push @cpu_batches, { keys => $1, cost => $2, busy => $3 eq 'working', pause => $4, cpu => $5, charged => $6, cpu_pause => $7 };
}
$reader->query_safe('COMMIT');
$reader->quit;
ok(@cpu_batches >= 5, 'CPU share: the call ran in batches (' . scalar(@cpu_batches) . ')');
is(scalar(grep { !$_->{busy} } @cpu_batches), 0, 'CPU share: every batch saw the snapshot held');
sub cpu_pause_for {
  my ($us) = @_;
  my $ms = ceil($us * (100 - $share) / $share / 1000);
  return $ms > 1000 ? 1000 : $ms;
}
sub budget_pause_for {  # the budget's pause with a delay of 1 ms
  my ($cost) = @_;
  my $ms = $cost > 0 ? ceil($cost / $limit) : 0;
  return $ms > 1000 ? 1000 : $ms;
}
my @wrong_cpu = grep { $_->{cpu_pause} != cpu_pause_for($_->{charged}) } @cpu_batches;
is(scalar(@wrong_cpu), 0, "CPU share: every CPU pause is the CPU since the last pause x (100 - $share) / $share")
  or diag(explain(\@wrong_cpu));
my @wrong_slept = grep {
  my $budget = budget_pause_for($_->{cost});
  $_->{pause} != ($_->{cpu_pause} > $budget ? $_->{cpu_pause} : $budget)
} @cpu_batches;
is(scalar(@wrong_slept), 0, 'CPU share: every pause is the larger of the two')
  or diag(explain(\@wrong_slept));
my $decided = grep { $_->{cpu_pause} > budget_pause_for($_->{cost}) } @cpu_batches;
is($decided, scalar(@cpu_batches), 'CPU share: at 1 percent it sets every pause');
my @not_own = grep { $_->{charged} < $_->{cpu} } @cpu_batches;
is(scalar(@not_own), 0, 'CPU share: no batch is charged less CPU than it used');
# Not the process's start: beyond its own CPU, the first batch is charged only the look after
# it (microseconds), as every batch is, where the start of a background worker (a fork, a
# connection, caches filled) is milliseconds of CPU. Both bounds, each far from the look.
{
  my ($charged, $own) = ($cpu_batches[0]{charged}, $cpu_batches[0]{cpu});
  ok($charged - $own < 2000 && $charged - $own < 0.5 * $charged,
    "CPU share: the first batch is charged the run's CPU, not the process's start ($charged us, its own $own us)");
}

done_testing();
