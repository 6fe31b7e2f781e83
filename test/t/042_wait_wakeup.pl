# Waiting without polling (issue #15): a claim_key with wait > 0 sleeps on a condition
# variable that the holder's transaction end wakes (shared_preload_libraries), so it
# returns right after the holder's COMMIT or ROLLBACK, not at the next poll (polling backs
# off to 50 ms: a median of about 25 ms). `wait` stays a hard upper bound, the wait is
# interruptible, and without preloading waiting still works by polling.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

sub handoffs {
  my ($node, $trials, $label) = @_;
  my $holder = $node->background_psql('postgres');
  my $waiter = $node->background_psql('postgres');
  # The handoff is measured from just before COMMIT: without a WAL flush to wait for, the
  # commit itself takes microseconds.
  $holder->query_safe('SET synchronous_commit = off');
  my @ms;
  my @statuses;
  for my $i (1 .. $trials) {
    my $key = "$label-$i";
    $holder->query_safe(qq{BEGIN; SELECT complete_key('$key', (claim_key('$key')).token, '{"done": $i}')});
    $waiter->{stdout} = '';
    $waiter->query_until(qr/waiting/, qq{\\echo waiting
      SELECT status || ' ' || extract(epoch FROM clock_timestamp()) FROM claim_key('$key', wait => '10 s');
      \\echo done
    });
    usleep(400_000);    # let the waiter sleep (polling has backed off to 50 ms by then)
    my $before = $holder->query_safe('SELECT extract(epoch FROM clock_timestamp()); COMMIT');
    pump_until($waiter->{run}, $waiter->{timeout}, \$waiter->{stdout}, qr/done/);
    my ($status, $woke) = $waiter->{stdout} =~ /(\w+) ([\d.]+)/;
    push @statuses, $status;
    push @ms, ($woke - $before) * 1000;
  }
  $holder->quit;
  $waiter->quit;
  my @sorted = sort { $a <=> $b } @ms;
  return (\@statuses, $sorted[int($#sorted / 2)], $sorted[-1]);
}

my $node = PostgreSQL::Test::Cluster->new('wait_wakeup');
$node->init;
$node->append_conf('postgresql.conf', q{shared_preload_libraries = 'idempotency'});
$node->start;
$node->safe_psql('postgres', q{CREATE EXTENSION idempotency; ALTER DATABASE postgres SET search_path = public, idempotency});

my ($statuses, $median, $max) = handoffs($node, 15, 'cv');
is(scalar(grep { $_ eq 'replay' } @$statuses), 15, 'every waiter got the holder\'s outcome (replay)');
diag(sprintf('preloaded: handoff after COMMIT median %.2f ms, max %.2f ms', $median, $max));
cmp_ok($median, '<', 10, 'the waiter wakes at the holder\'s COMMIT, not at the next poll (median < 10 ms)');

# A rollback wakes the waiter too, which then claims the key.
my $holder = $node->background_psql('postgres');
$holder->query_safe(q{BEGIN; SELECT claim_key('rolled')});
my $waiter = $node->background_psql('postgres');
$waiter->query_until(qr/waiting/, qq{\\echo waiting
  SELECT status FROM claim_key('rolled', wait => '10 s');
  \\echo done
});
usleep(150_000);
my $t0 = time;
$holder->query_safe('ROLLBACK');
pump_until($waiter->{run}, $waiter->{timeout}, \$waiter->{stdout}, qr/done/);
my $took = time - $t0;
like($waiter->{stdout}, qr/claimed/, 'after the holder\'s ROLLBACK the waiter claims the key');
cmp_ok($took, '<', 1, "at once (${took}s)");
$waiter->query_safe('ROLLBACK') if 0;

# wait is a hard upper bound: an open holder that never ends.
$holder->query_safe(q{BEGIN; SELECT claim_key('forever')});
my $w0 = time;
is($node->safe_psql('postgres', q{SELECT status FROM claim_key('forever', wait => '300 ms')}), 'in_progress',
  'a holder that stays open: in_progress when wait is over');
my $waited = time - $w0;
cmp_ok($waited, '>=', 0.3, 'after the whole wait');
cmp_ok($waited, '<', 2, "and not much longer (${waited}s)");

# Interruptible: statement_timeout cancels a long wait.
my ($rc, $out, $err) = $node->psql('postgres',
  q{SET statement_timeout = '200ms'; SELECT status FROM claim_key('forever', wait => '60 s')});
like($err, qr/canceling statement due to statement timeout/, 'a wait is interruptible (statement_timeout)');
$holder->query_safe('ROLLBACK');
$holder->quit;
$waiter->quit;
$node->stop;

# Without preloading: no shared memory, waiting polls, and still gets the outcome.
my $plain = PostgreSQL::Test::Cluster->new('wait_polling');
$plain->init;
$plain->append_conf('postgresql.conf', q{shared_preload_libraries = ''});
$plain->start;
$plain->safe_psql('postgres', q{CREATE EXTENSION idempotency; ALTER DATABASE postgres SET search_path = public, idempotency});
($statuses, $median, $max) = handoffs($plain, 5, 'poll');
is(scalar(grep { $_ eq 'replay' } @$statuses), 5, 'without preloading the waiters still get the outcome (polling)');
diag(sprintf('not preloaded (polling): handoff median %.2f ms, max %.2f ms', $median, $max));
$plain->stop;
done_testing();
