# Every wake-up of a waiting claim (issue #22), each told apart from the fallbacks by the
# waiter's own bound rather than by the machine's speed:
#   - a holder's end wakes the waiter: its ROLLBACK of a claim, its COMMIT of a claim and
#     completion, and, in the two-phase pattern, the COMMIT of a completion or a release.
#     Each waiter waits for less than the safety net's period (200 ms, src/key_wait.cpp), so
#     without the wake-up it would sleep to the end of its wait; it must return before that.
#   - the safety net wakes a waiter that nobody signals: a lease that runs out while someone
#     waits, and a holder's transaction that ends in another backend (PREPARE TRANSACTION,
#     COMMIT PREPARED). The waiter must get the key long before its (long) wait ends.
# The holder ends its transaction in the round trip in which it sees the waiter asleep
# (pg_stat_activity, wait event Extension): no sleep-and-hope.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('wait_wakeups');
$node->init;
$node->append_conf('postgresql.conf', qq{shared_preload_libraries = 'idempotency'\nmax_prepared_transactions = 2});
$node->start;
$node->safe_psql('postgres',
  q{CREATE EXTENSION idempotency; ALTER DATABASE postgres SET search_path = public, idempotency});

my $holder = $node->background_psql('postgres');
my $waiter = $node->background_psql('postgres');
my $waiter_pid = $waiter->query_safe('SELECT pg_backend_pid()');

# Runs `sql` in the holder's session once the waiter sleeps on its key (bounded: 10 s).
sub when_waiter_sleeps {
  my ($sql) = @_;
  return $holder->query_safe(qq{DO \$\$
    BEGIN
      FOR i IN 1 .. 10000 LOOP
        PERFORM pg_stat_clear_snapshot();
        EXIT WHEN EXISTS (SELECT FROM pg_stat_activity WHERE pid = $waiter_pid AND wait_event_type = 'Extension');
        PERFORM pg_sleep(0.001);
      END LOOP;
    END \$\$;
    $sql});
}

# Starts the waiter's claim of `key` with `wait`; returns after the statement was sent.
sub start_waiting {
  my ($key, $wait) = @_;
  $waiter->{stdout} = '';
  $waiter->query_until(qr/waiting/, qq{\\echo waiting
    SELECT status || ' ' || round(extract(epoch FROM clock_timestamp() - statement_timestamp()) * 1000)
      FROM claim_key('$key', wait => '$wait');
    \\echo done
  });
}

# The waiter's answer: (status, milliseconds its claim took).
sub waiter_answer {
  pump_until($waiter->{run}, $waiter->{timeout}, \$waiter->{stdout}, qr/done/);
  my ($status, $ms) = $waiter->{stdout} =~ /(\w+) (\d+)/;
  return ($status // 'none', $ms // -1);
}

sub median { my @s = sort { $a <=> $b } @_; return $s[int($#s / 2)]; }

# A wake-up by the holder's end: `prepare` (SQL of the holder, for trial i's key) leaves an
# open transaction that wrote the key, `end` ends it; the waiter waits 190 ms.
my $short_wait_ms = 190;
sub woken_by_holder {
  my ($label, $setup, $prepare, $end, $expected) = @_;
  my (@statuses, @ms);
  for my $i (1 .. 5) {
    my $key = "$label-$i";
    $node->safe_psql('postgres', $setup->($key)) if $setup;
    $holder->query_safe($prepare->($key));
    start_waiting($key, "$short_wait_ms ms");
    when_waiter_sleeps($end);
    my ($status, $took) = waiter_answer();
    push @statuses, $status;
    push @ms, $took;
  }
  is(join(',', @statuses), join(',', ($expected) x 5), "$label: the waiter gets $expected each time");
  my $median = median(@ms);
  cmp_ok($median, '<', $short_wait_ms,
    "$label: the waiter returns before its ${short_wait_ms} ms wait ends (median ${median} ms, all: @ms)");
}

# The holder rolls its claim back: the waiter claims the key.
woken_by_holder('rollback', undef, sub { qq{BEGIN; SELECT claim_key('$_[0]')} }, 'ROLLBACK', 'claimed');
# The holder commits its claim and completion (the inbox pattern): the waiter replays.
woken_by_holder('commit', undef,
  sub { qq{BEGIN; SELECT complete_key('$_[0]', (claim_key('$_[0]')).token, '{"done": true}')} }, 'COMMIT', 'replay');
# Two-phase: the claim was committed earlier; the holder's transaction only completes it.
$node->safe_psql('postgres', q{CREATE TABLE tokens (key text PRIMARY KEY, token uuid)});
my $committed_claim = sub { qq{INSERT INTO tokens SELECT '$_[0]', token FROM claim_key('$_[0]', lease => '1 hour')} };
woken_by_holder('completion', $committed_claim,
  sub { qq{BEGIN; SELECT complete_key('$_[0]', (SELECT token FROM tokens WHERE key = '$_[0]'), '{"done": 2}')} },
  'COMMIT', 'replay');
# Two-phase: the holder's transaction releases the committed claim: the waiter reclaims.
woken_by_holder('release', $committed_claim,
  sub { qq{BEGIN; SELECT release_key('$_[0]', (SELECT token FROM tokens WHERE key = '$_[0]'))} },
  'COMMIT', 'reclaimed');

# Two sessions wait on one key: the holder's end wakes both (a broadcast, not one signal),
# so neither sleeps to the end of its wait. The holder commits once both sleep, counted by
# their own PIDs among client backends (the cleanup launcher sleeps under the same wait
# event). Each trial's verdict is the slower waiter's: both replay, and it returns before its
# 190 ms wait ends (a waiter left asleep returns only at its wait's end, every time).
my $second = $node->background_psql('postgres');
my $second_pid = $second->query_safe('SELECT pg_backend_pid()');
sub start_second_waiting {
  my ($key, $wait) = @_;
  $second->{stdout} = '';
  $second->query_until(qr/waiting/, qq{\\echo waiting
    SELECT status || ' ' || round(extract(epoch FROM clock_timestamp() - statement_timestamp()) * 1000)
      FROM claim_key('$key', wait => '$wait');
    \\echo done
  });
}
sub second_answer {
  pump_until($second->{run}, $second->{timeout}, \$second->{stdout}, qr/done/);
  my ($status, $ms) = $second->{stdout} =~ /(\w+) (\d+)/;
  return ($status // 'none', $ms // -1);
}
{
  my (@statuses, @slower);
  for my $i (1 .. 5) {
    my $key = "two-waiters-$i";
    $holder->query_safe(qq{BEGIN; SELECT complete_key('$key', (claim_key('$key')).token, '{"done": 3}')});
    start_waiting($key, "$short_wait_ms ms");
    start_second_waiting($key, "$short_wait_ms ms");
    $holder->query_safe(qq{DO \$\$
      BEGIN
        FOR i IN 1 .. 10000 LOOP
          PERFORM pg_stat_clear_snapshot();
          EXIT WHEN (SELECT count(*) FROM pg_stat_activity
                      WHERE pid IN ($waiter_pid, $second_pid) AND backend_type = 'client backend'
                        AND wait_event_type = 'Extension') = 2;
          PERFORM pg_sleep(0.001);
        END LOOP;
      END \$\$;
      COMMIT});
    my ($status1, $ms1) = waiter_answer();
    my ($status2, $ms2) = second_answer();
    push @statuses, "$status1/$status2";
    push @slower, $ms1 > $ms2 ? $ms1 : $ms2;
  }
  is(join(',', @statuses), join(',', ('replay/replay') x 5), 'two waiters on one key: both replay each time');
  my $median = median(@slower);
  cmp_ok($median, '<', $short_wait_ms,
    "two waiters on one key: the slower returns before its ${short_wait_ms} ms wait ends (median ${median} ms, all: @slower)");
}
$second->quit;

# The safety net: a committed claim whose lease (300 ms) runs out while the waiter waits
# (5 s). Nobody ends a transaction: the waiter must look again on its own.
$node->safe_psql('postgres', q{SELECT claim_key('lease-runs-out', lease => '300 ms')});
start_waiting('lease-runs-out', '5 s');
my ($status, $took) = waiter_answer();
is($status, 'reclaimed', 'a lease that runs out while a claim waits: the waiter reclaims the key');
cmp_ok($took, '<', 5000, "before its 5 s wait ends (${took} ms)");

# The safety net: a prepared transaction ends by COMMIT PREPARED, whose transaction wrote no
# key itself and wakes nobody. The waiter must still replay long before its wait ends.
$holder->query_safe(
  q{BEGIN; SELECT complete_key('prepared', (claim_key('prepared')).token, '{"p": 1}'); PREPARE TRANSACTION 'idem_046'});
start_waiting('prepared', '5 s');
when_waiter_sleeps(q{COMMIT PREPARED 'idem_046'});
($status, $took) = waiter_answer();
is($status, 'replay', 'a holder that ends by COMMIT PREPARED: the waiter replays its outcome');
cmp_ok($took, '<', 5000, "before its 5 s wait ends (${took} ms)");

$holder->quit;
$waiter->quit;
$node->stop;
done_testing();
