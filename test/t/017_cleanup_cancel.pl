# A large idempotency_cleanup() answers interrupts (issues #20/#21): a cancel, a
# statement_timeout and a termination of the caller all end the call, and its worker stops
# deleting right after. The verdicts are events, not durations: the throttle makes the call
# one that cannot end during the test (idempotency.cleanup_cost_limit = 1 and a session of
# `app` holding a snapshot, so that other sessions count as working: one key per batch, then
# a pause of idempotency.cleanup_delay, 1 s), so a caller that answers, and a worker that is
# gone, while keys are left show that the interrupt, not the end of the work, ended them; and
# a worker that stopped deletes nothing afterwards. Figures (diag), all read on the server so
# that no client round trip is in them: the time from pg_cancel_backend() to the caller's
# state change, from the statement's start to its timeout's answer, and from the signal (or
# the answer) until the call's worker has gone. They are printed, not judged (they were
# bounds, 200 ms and a second, that a loaded machine broke).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemSession;

my $node = PostgreSQL::Test::Cluster->new('cleanup_cancel');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.cleanup_cost_limit = 1
idempotency.cleanup_delay = '1000ms'
});
$node->start;
$node->safe_psql('postgres', 'CREATE DATABASE app');
# The background worker stays out: the calls below are the only deleters.
$node->safe_psql('app', q{
  CREATE EXTENSION idempotency;
  ALTER DATABASE app SET idempotency.cleanup_worker = off});
# Other sessions at work, as the throttle sees them: one of `app` holds a snapshot.
my $busy = long_session($node, 'app');
$busy->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1');

sub fill {
  my ($n) = @_;
  $node->safe_psql('app', qq{
    INSERT INTO idempotency.idempotency_keys (key, owner, ttl, lease, created_at, expires_at, updated_at)
    SELECT 'old' || g || '-' || md5(random()::text), current_user, '1 hour', '5 min',
           now() - interval '2 hours', now() - interval '1 hour' + g * interval '1 us', now()
      FROM generate_series(1, $n) g});
}

sub left { return $node->safe_psql('app', 'SELECT count(*) FROM idempotency.idempotency_keys'); }

# Starts a call with batches of (at most) 1000 in a background session; returns the session and its
# backend's pid once the call's worker has deleted some keys.
sub start_call {
  my ($before, $settings) = @_;
  my $session = long_session($node, 'app', on_error_stop => 0);
  my $pid = $session->query_safe('SELECT pg_backend_pid()');
  $pid =~ s/\s+//g;
  $session->query_until(qr/started/, "$settings\n\\echo started\nSELECT idempotency.idempotency_cleanup(1000);\n");
  $node->poll_query_until('app', qq{SELECT count(*) < $before FROM idempotency.idempotency_keys})
    or diag('the call deleted nothing');
  return ($session, $pid);
}

# Milliseconds from $since until no call worker is left, watched on the server every
# millisecond (for at most a minute: '' then).
$node->safe_psql('app', q{
  CREATE FUNCTION public.worker_gone_after(since timestamptz) RETURNS numeric
  LANGUAGE plpgsql AS $$
  BEGIN
    FOR i IN 1 .. 60000 LOOP
      PERFORM pg_stat_clear_snapshot();
      IF NOT EXISTS (SELECT FROM pg_stat_activity WHERE backend_type = 'idempotency cleanup call') THEN
        RETURN round(extract(epoch FROM clock_timestamp() - since) * 1000, 1);
      END IF;
      PERFORM pg_sleep(0.001);
    END LOOP;
    RETURN NULL;
  END $$});

sub worker_gone_after {
  my ($since) = @_;
  return $node->safe_psql('app', "SELECT public.worker_gone_after('$since')");
}

# Sends a signal by `function` (pg_cancel_backend, pg_terminate_backend) to `pid` and returns
# the time just before (the CTE is evaluated first).
sub signal {
  my ($function, $pid) = @_;
  return $node->safe_psql('app', qq{
    WITH t AS MATERIALIZED (SELECT clock_timestamp() AS sent)
    SELECT sent FROM t WHERE $function($pid)});
}

fill(100000);
my $total = left();
is($total, '100000', '100,000 expired keys');

# --- pg_cancel_backend() --------------------------------------------------------------------
my ($session, $pid) = start_call($total, '');
is($node->safe_psql('postgres', q{
    SELECT count(*) FROM pg_stat_activity
     WHERE backend_type = 'idempotency cleanup call' AND query LIKE '%batch of expired keys%'}),
  '1', 'the call runs in its worker, batch by batch');
my $cancel_at = signal('pg_cancel_backend', $pid);
my $gone_ms = worker_gone_after($cancel_at);
isnt($gone_ms, '', 'its worker goes');
ok($node->poll_query_until('app', qq{SELECT state <> 'active' FROM pg_stat_activity WHERE pid = $pid}),
  'the call ends');
my $latency_ms = $node->safe_psql('app', qq{
  SELECT round(extract(epoch FROM state_change - '$cancel_at'::timestamptz) * 1000, 1)
    FROM pg_stat_activity WHERE pid = $pid});
my $after = left();
diag("cancel: the caller answered $latency_ms ms after pg_cancel_backend(), its worker was gone "
    . "after $gone_ms ms; " . ($total - $after) . ' keys deleted before');
# (A caller that waited for its worker to finish would never answer here; an answer needs no
# I/O, only the caller's next look at its interrupts.)
like($session->query('SELECT 1'), qr/^1/, 'the session goes on');
like($session->{stderr}, qr/canceling statement due to user request/, 'with the cancel reported');
cmp_ok($after, '>', 0, 'keys are left: the cancel, not the end of the work, ended the call and its worker');
cmp_ok($after, '<', $total, 'and the batches done before the cancel stay deleted');
# The worker is gone: nothing deletes now (two looks, a moment apart).
$node->safe_psql('app', 'SELECT pg_sleep(0.2)');
is(left(), $after, 'no deletion after the cancel');
end_session($session);

# --- statement_timeout ----------------------------------------------------------------------
$total = $after;
($session, $pid) = start_call($total, "SET statement_timeout = '500ms';");
ok($node->poll_query_until('app', qq{SELECT state <> 'active' FROM pg_stat_activity WHERE pid = $pid}),
  'a call under statement_timeout ends');
my $took = $node->safe_psql('app', qq{
  SELECT round(extract(epoch FROM state_change - query_start) * 1000, 1) FROM pg_stat_activity WHERE pid = $pid});
my $answered_at = $node->safe_psql('app', "SELECT state_change FROM pg_stat_activity WHERE pid = $pid");
$gone_ms = worker_gone_after($answered_at);
diag(sprintf('statement_timeout = 500ms: the call took %s ms (%.1f ms after its timeout), its '
      . 'worker was gone %s ms after the caller answered', $took, $took - 500, $gone_ms));
cmp_ok($took, '>=', 500, "not before its timeout ($took ms)");
$session->query('SELECT 1');
like($session->{stderr}, qr/canceling statement due to statement timeout/, 'with 57014 reported');
isnt($gone_ms, '', 'its worker goes too');
cmp_ok(left(), '>', 0, 'while keys are left');
end_session($session);

# --- the caller terminated ----------------------------------------------------------------
$total = left();
($session, $pid) = start_call($total, '');
my $terminated_at = signal('pg_terminate_backend', $pid);
$gone_ms = worker_gone_after($terminated_at);
diag("the caller terminated: its worker was gone after $gone_ms ms");
isnt($gone_ms, '', 'when the caller is terminated, its worker goes');
$after = left();
$node->safe_psql('app', 'SELECT pg_sleep(0.2)');
is(left(), $after, 'and deletes nothing more');
cmp_ok($after, '>', 0, 'keys are left for the next cleanup');
eval { end_session($session) };  # its psql lost the connection
ok(!$node->log_contains(qr/idempotency.*(FATAL|PANIC)|(FATAL|PANIC).*idempotency/),
  'no worker logged a FATAL');

end_session($busy);
$node->stop;
done_testing();
