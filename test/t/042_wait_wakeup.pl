# Waiting without polling (issue #15): a claim_key with wait > 0 sleeps on a condition
# variable that the holder's transaction end wakes (shared_preload_libraries), so it
# returns right after the holder's COMMIT or ROLLBACK, not at the next poll (polling backs
# off to 50 ms: a median of about 25 ms). `wait` stays a hard upper bound, the wait is
# interruptible, and without preloading waiting still works by polling.
# The verdicts are events, not durations: the waiters wait an hour, and with preloading their
# sessions set idempotency.wait_recheck_interval (the safety net's period) to an hour, so a
# waiter returns before its wait (an hour) ends only if the holder's end wakes it: its
# returning at all, well within the harness's timeout, is the verdict; the holder ends its
# transaction once it sees the waiter asleep (wait event Extension). The handoff's time is
# printed, not judged.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemSession;
use Time::HiRes qw(time);

# Waits until the backend `pid` sleeps in a wait of the extension (bounded: 10 s).
sub asleep_sql {
  my ($pid) = @_;
  return qq{DO \$\$
    BEGIN
      FOR i IN 1 .. 10000 LOOP
        PERFORM pg_stat_clear_snapshot();
        EXIT WHEN EXISTS (SELECT FROM pg_stat_activity WHERE pid = $pid AND wait_event_type = 'Extension');
        PERFORM pg_sleep(0.001);
      END LOOP;
    END \$\$};
}

# A waiter's session: the safety net an hour off (where the library is preloaded).
sub waiter_session {
  my ($node) = @_;
  my $waiter = long_session($node, 'postgres');
  $waiter->query_safe(q{SET idempotency.wait_recheck_interval = '1h'});
  my $pid = $waiter->query_safe('SELECT pg_backend_pid()');
  $pid =~ s/\s+//g;
  return ($waiter, $pid);
}

# Trials of a holder's COMMIT handing a key to a waiter that waits an hour: the statuses the
# waiters got, the number that returned before their wait's end, the median and largest
# handoff in ms (from just before COMMIT; printed only).
sub handoffs {
  my ($node, $trials, $label) = @_;
  my $holder = long_session($node, 'postgres');
  my ($waiter, $pid) = waiter_session($node);
  # The handoff is measured from just before COMMIT: without a WAL flush to wait for, the
  # commit itself takes microseconds.
  $holder->query_safe('SET synchronous_commit = off');
  my (@ms, @statuses);
  my $early = 0;
  for my $i (1 .. $trials) {
    my $key = "$label-$i";
    $holder->query_safe(qq{BEGIN; SELECT complete_key('$key', (claim_key('$key')).token, '{"done": $i}')});
    $waiter->{stdout} = '';
    $waiter->query_until(qr/waiting/, qq{\\echo waiting
      SELECT status || ' ' || extract(epoch FROM clock_timestamp()) || ' '
             || (clock_timestamp() < statement_timestamp() + interval '1 hour')
        FROM claim_key('$key', wait => '1 hour');
      \\echo done
    });
    my $before = $holder->query_safe(asleep_sql($pid) . '; SELECT extract(epoch FROM clock_timestamp()); COMMIT');
    pump_until($waiter->{run}, $waiter->{timeout}, \$waiter->{stdout}, qr/done/);
    my ($status, $woke, $before_end) = $waiter->{stdout} =~ /(\w+) ([\d.]+) (\w+)/;
    push @statuses, $status // 'none';
    $early++ if ($before_end // '') eq 'true';
    push @ms, (($woke // $before) - $before) * 1000;
  }
  end_session($holder);
  end_session($waiter);
  my @sorted = sort { $a <=> $b } @ms;
  return (\@statuses, $early, $sorted[int($#sorted / 2)], $sorted[-1]);
}

my $node = PostgreSQL::Test::Cluster->new('wait_wakeup');
$node->init;
$node->append_conf('postgresql.conf', q{shared_preload_libraries = 'idempotency'});
$node->start;
$node->safe_psql('postgres', q{CREATE EXTENSION idempotency; ALTER DATABASE postgres SET search_path = public, idempotency});

my ($statuses, $early, $median, $max) = handoffs($node, 15, 'cv');
is(scalar(grep { $_ eq 'replay' } @$statuses), 15, 'every waiter got the holder\'s outcome (replay)');
diag(sprintf('preloaded: handoff after COMMIT median %.2f ms, max %.2f ms', $median, $max));
is($early, 15, 'the waiter wakes at the holder\'s COMMIT, long before its wait or the safety net would end its sleep');

# A rollback wakes the waiter too, which then claims the key.
my $holder = long_session($node, 'postgres');
$holder->query_safe(q{BEGIN; SELECT claim_key('rolled')});
my ($waiter, $waiter_pid) = waiter_session($node);
$waiter->query_until(qr/waiting/, qq{\\echo waiting
  SELECT status || ' ' || (clock_timestamp() < statement_timestamp() + interval '1 hour')
    FROM claim_key('rolled', wait => '1 hour');
  \\echo done
});
$holder->query_safe(asleep_sql($waiter_pid) . '; ROLLBACK');
pump_until($waiter->{run}, $waiter->{timeout}, \$waiter->{stdout}, qr/done/);
like($waiter->{stdout}, qr/claimed/, 'after the holder\'s ROLLBACK the waiter claims the key');
like($waiter->{stdout}, qr/claimed true/, 'at once: before its wait ends');

# wait is a hard upper bound: an open holder that never ends. The answer itself shows that
# the wait ended (nothing else could end it); its length is checked from below only.
$holder->query_safe(q{BEGIN; SELECT claim_key('forever')});
my $w0 = time;
is($node->safe_psql('postgres', q{SELECT status FROM claim_key('forever', wait => '300 ms')}), 'in_progress',
  'a holder that stays open: in_progress when wait is over');
my $waited = time - $w0;
cmp_ok($waited, '>=', 0.3, "after the whole wait (${waited}s)");

# Interruptible: statement_timeout cancels a long wait.
my ($rc, $out, $err) = $node->psql('postgres',
  q{SET statement_timeout = '200ms'; SELECT status FROM claim_key('forever', wait => '60 s')});
like($err, qr/canceling statement due to statement timeout/, 'a wait is interruptible (statement_timeout)');
$holder->query_safe('ROLLBACK');
end_session($holder);
end_session($waiter);
$node->stop;

# Without preloading: no shared memory, waiting polls, and still gets the outcome.
my $plain = PostgreSQL::Test::Cluster->new('wait_polling');
$plain->init;
$plain->append_conf('postgresql.conf', q{shared_preload_libraries = ''});
$plain->start;
$plain->safe_psql('postgres', q{CREATE EXTENSION idempotency; ALTER DATABASE postgres SET search_path = public, idempotency});
($statuses, $early, $median, $max) = handoffs($plain, 5, 'poll');
is(scalar(grep { $_ eq 'replay' } @$statuses), 5, 'without preloading the waiters still get the outcome (polling)');
diag(sprintf('not preloaded (polling): handoff median %.2f ms, max %.2f ms', $median, $max));
$plain->stop;
done_testing();
