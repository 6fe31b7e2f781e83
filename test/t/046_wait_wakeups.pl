# Every wake-up of a waiting claim (issue #22), each told apart from the fallbacks by events,
# not by the machine's speed:
#   - a holder's end wakes the waiter: its ROLLBACK of a claim, its COMMIT of a claim and
#     completion, and, in the two-phase pattern, the COMMIT of a completion or a release.
#     The waiter waits an hour, and its session sets idempotency.wait_recheck_interval (the
#     safety net's period, 200 ms by default) to an hour too: without the wake-up it would
#     sleep on, so its returning at all (well within the harness's timeout, which only bounds
#     the run) is the verdict. A waiter that does not return is cancelled and counted.
#   - with the hour-long interval, a holder that ends without waking anyone (COMMIT PREPARED)
#     leaves the waiter asleep: the interval is what the verdicts above rely on.
#   - the safety net (the default interval) wakes a waiter that nobody signals: a lease that
#     runs out while someone waits, and a holder's transaction that ends in another backend
#     (PREPARE TRANSACTION, COMMIT PREPARED). The waiter, waiting an hour, must return.
# The holder ends its transaction in the round trip in which it sees the waiter asleep
# (pg_stat_activity, wait event Extension): no sleep-and-hope.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemSession;

my $node = PostgreSQL::Test::Cluster->new('wait_wakeups');
$node->init;
$node->append_conf('postgresql.conf', qq{shared_preload_libraries = 'idempotency'\nmax_prepared_transactions = 2});
$node->start;
$node->safe_psql('postgres',
  q{CREATE EXTENSION idempotency; ALTER DATABASE postgres SET search_path = public, idempotency});

my $long_wait = '1 hour';
my $holder = long_session($node, 'postgres');
# A waiter's session: it keeps going after an error (a cancelled claim).
sub waiter_session {
  my $session = long_session($node, 'postgres', on_error_stop => 0);
  $session->query_safe(q{SET idempotency.wait_recheck_interval = '1h'});
  my $pid = $session->query_safe('SELECT pg_backend_pid()');
  $pid =~ s/\s+//g;
  return { session => $session, pid => $pid };
}
my $waiter = waiter_session();

# Runs `sql` in the holder's session once the waiters (pids) all sleep on their key
# (bounded: 10 s).
sub when_asleep {
  my ($sql, @pids) = @_;
  my $count = scalar @pids;
  my $list = join(', ', @pids);
  return $holder->query_safe(qq{DO \$\$
    BEGIN
      FOR i IN 1 .. 10000 LOOP
        PERFORM pg_stat_clear_snapshot();
        EXIT WHEN (SELECT count(*) FROM pg_stat_activity
                    WHERE pid IN ($list) AND backend_type = 'client backend'
                      AND wait_event_type = 'Extension') = $count;
        PERFORM pg_sleep(0.001);
      END LOOP;
    END \$\$;
    $sql});
}

# Starts a waiter's claim of `key` with `wait`; returns after the statement was sent.
sub start_waiting {
  my ($w, $key, $wait) = @_;
  $w->{session}{stdout} = '';
  $w->{session}{stderr} = '';
  $w->{session}->query_until(qr/waiting/, qq{\\echo waiting
    SELECT 'status ' || status FROM claim_key('$key', wait => '$wait');
    \\echo done
  });
}

# Did the waiter's claim return (its backend went idle)? One that has not returned when the
# harness's timeout is up is cancelled (its sleep would last the hour), and false. After
# one has slept on, the wake-up cases left are skipped: each would cost the timeout again.
my $slept_on = 0;
sub returns {
  my ($w) = @_;
  my $returned = $node->poll_query_until('postgres',
    "SELECT state <> 'active' FROM pg_stat_activity WHERE pid = $w->{pid}");
  $node->safe_psql('postgres', "SELECT pg_cancel_backend($w->{pid})") unless $returned;
  $slept_on = 1 unless $returned;
  $w->{session}{timeout}->start();  # the answer's own time to come
  return $returned;
}

# The waiter's answer: its status ('none' after an error).
sub answer {
  my ($w) = @_;
  pump_until($w->{session}{run}, $w->{session}{timeout}, \$w->{session}{stdout}, qr/done/);
  my ($status) = $w->{session}{stdout} =~ /status (\w+)/;
  return $status // 'none';
}

# A wake-up by the holder's end: `prepare` (SQL of the holder, for trial i's key) leaves an
# open transaction that wrote the key, `end` ends it. Five trials.
sub woken_by_holder {
  my ($label, $setup, $prepare, $end, $expected) = @_;
  SKIP: {
  skip "$label: a waiter slept on before", 2 if $slept_on;
  my (@statuses, $woken);
  $woken = 0;
  for my $i (1 .. 5) {
    my $key = "$label-$i";
    $node->safe_psql('postgres', $setup->($key)) if $setup;
    $holder->query_safe($prepare->($key));
    start_waiting($waiter, $key, $long_wait);
    when_asleep($end, $waiter->{pid});
    my $returned = returns($waiter);
    $woken++ if $returned;
    push @statuses, answer($waiter);
    last unless $returned;  # one that slept on is enough (each costs the harness's timeout)
  }
  is($woken, 5, "$label: the holder's end wakes the waiter each time (its wait and its look-again are an hour off)");
  is(join(',', @statuses), join(',', ($expected) x 5), "$label: the waiter gets $expected each time");
  }
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

# Two sessions wait on one key: the holder's end wakes both (a broadcast, not one signal). The
# holder commits once both sleep, counted by their own PIDs among client backends (the
# cleanup launcher sleeps under the same wait event).
my $second = waiter_session();
SKIP: {
  skip 'two waiters: a waiter slept on before', 2 if $slept_on;
  my (@statuses, $woken);
  $woken = 0;
  for my $i (1 .. 5) {
    my $key = "two-waiters-$i";
    $holder->query_safe(qq{BEGIN; SELECT complete_key('$key', (claim_key('$key')).token, '{"done": 3}')});
    start_waiting($waiter, $key, $long_wait);
    start_waiting($second, $key, $long_wait);
    when_asleep('COMMIT', $waiter->{pid}, $second->{pid});
    my $first_returned = returns($waiter);
    my $second_returned = returns($second);
    $woken++ if $first_returned && $second_returned;
    push @statuses, answer($waiter) . '/' . answer($second);
    last unless $first_returned && $second_returned;
  }
  is($woken, 5, "two waiters on one key: the holder's end wakes both each time");
  is(join(',', @statuses), join(',', ('replay/replay') x 5), 'two waiters on one key: both replay each time');
}
end_session($second->{session});

# With the hour-long interval, a holder that ends in another backend wakes nobody: the
# waiter sleeps on after COMMIT PREPARED (then it is cancelled).
$holder->query_safe(
  q{BEGIN; SELECT complete_key('unwoken', (claim_key('unwoken')).token, '{"p": 0}'); PREPARE TRANSACTION 'idem_046_unwoken'});
start_waiting($waiter, 'unwoken', $long_wait);
when_asleep(q{COMMIT PREPARED 'idem_046_unwoken'}, $waiter->{pid});
is($node->safe_psql('postgres',
    "SELECT state || ' ' || wait_event_type FROM pg_stat_activity WHERE pid = $waiter->{pid}"),
  'active Extension', 'a holder that ends without a wake-up leaves the waiter asleep (the interval holds it)');
$node->safe_psql('postgres', "SELECT pg_cancel_backend($waiter->{pid})");
is(answer($waiter), 'none', 'until it is cancelled');

# The safety net, at its default interval.
# (query, not query_safe: the cancel's error may reach psql's stderr only now.)
$waiter->{session}->query('RESET idempotency.wait_recheck_interval');
# A committed claim whose lease (300 ms) runs out while the waiter waits. Nobody ends a
# transaction: the waiter must look again on its own.
SKIP: {
skip 'the safety net: a waiter slept on before', 4 if $slept_on;
$node->safe_psql('postgres', q{SELECT claim_key('lease-runs-out', lease => '300 ms')});
start_waiting($waiter, 'lease-runs-out', $long_wait);
ok(returns($waiter), 'a lease that runs out while a claim waits: the safety net wakes the waiter');
is(answer($waiter), 'reclaimed', 'which reclaims the key');

# A prepared transaction ends by COMMIT PREPARED, whose transaction wrote no key itself and
# wakes nobody. The waiter must still replay.
skip 'COMMIT PREPARED: a waiter slept on before', 2 if $slept_on;
$holder->query_safe(
  q{BEGIN; SELECT complete_key('prepared', (claim_key('prepared')).token, '{"p": 1}'); PREPARE TRANSACTION 'idem_046'});
start_waiting($waiter, 'prepared', $long_wait);
when_asleep(q{COMMIT PREPARED 'idem_046'}, $waiter->{pid});
ok(returns($waiter), 'a holder that ends by COMMIT PREPARED: the safety net wakes the waiter');
is(answer($waiter), 'replay', 'which replays its outcome');
}

end_session($holder);
end_session($waiter->{session});
$node->stop;
done_testing();
