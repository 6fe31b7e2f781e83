# A batch of a million keys answers cancels and timeouts within an element's time, and the
# memory a batch needs beyond its input array lives in PostgreSQL memory contexts and does
# not grow per element (issue #21 item 4, issue #20 item 10).
#  - statement_timeout = 300ms stops claim_keys of 1,000,000 keys (1.1 ran the whole batch,
#    6 s here, before it noticed); so does pg_cancel_backend from another session (7.7 s);
#  - a backend that claims 400,000 keys peaks at no more memory than one that merely unnests
#    the same array, plus a constant (1.1 held ~100 bytes per element in C++ containers:
#    +40 MB here, outside every memory context).
# The figures are printed (note lines) for the closing notes. The verdicts of the interrupts
# are events, not durations: the rows the batch inserted before it stopped (the table's
# n_tup_ins, which counts the rows of aborted transactions too) are fewer than its million,
# so the interrupt, not the batch's end, stopped it. The memory's are bounds far above what
# the code needs and far below what 1.1 took.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemSession;
use Time::HiRes qw(time usleep);

my $node = PostgreSQL::Test::Cluster->new('batch_limits');
$node->init;
$node->append_conf('postgresql.conf', "work_mem = '4MB'\n");
$node->start;
$node->safe_psql('postgres', q{
  CREATE EXTENSION idempotency;
  CREATE ROLE app LOGIN;
  GRANT USAGE ON SCHEMA idempotency TO app;
  CREATE TABLE batches (n int PRIMARY KEY, keys text[]);
  INSERT INTO batches SELECT 1000000, array_agg('m-' || g) FROM generate_series(1, 1000000) g;
  INSERT INTO batches SELECT 400000, array_agg('r-' || g) FROM generate_series(1, 400000) g;
  GRANT SELECT ON batches TO app;
});

# Rows inserted into the key table so far, committed or not, once the statistics of the
# sessions that have ended are in.
sub inserted {
  return $node->safe_psql('postgres', q{
    SELECT pg_stat_force_next_flush();
    SELECT n_tup_ins FROM pg_stat_user_tables WHERE relid = 'idempotency.idempotency_keys'::regclass});
}
# The rows inserted once every session of `app` has ended (a backend sends its statistics
# before it leaves pg_stat_activity).
sub inserted_once_app_left {
  $node->poll_query_until('postgres', q{
    SELECT NOT EXISTS (SELECT FROM pg_stat_activity WHERE usename = 'app')})
    or diag('a session of app is still there');
  return inserted();
}

# statement_timeout ends a million-key batch within its element's time.
my $inserted_before = inserted();
my $t0 = time;
my ($rc, $out, $err) = $node->psql('postgres', q{
  SET statement_timeout = '300ms';
  SELECT count(*) FROM idempotency.claim_keys((SELECT keys FROM batches WHERE n = 1000000));
}, extra_params => [ '-U', 'app' ]);
my $elapsed = time - $t0;
like($err, qr/canceling statement due to statement timeout/, 'statement_timeout cancels claim_keys of 1,000,000 keys');
note(sprintf('claim_keys of 1,000,000 keys with statement_timeout = 300ms returned after %.0f ms', $elapsed * 1000));
my $inserted = inserted_once_app_left() - $inserted_before;
note("it had claimed $inserted keys");
cmp_ok($inserted, '<', 1000000, 'it stops before the batch could have finished (fewer than its million rows inserted)');
is($node->safe_psql('postgres', 'SELECT count(*) FROM idempotency.idempotency_keys'), '0', 'and nothing is kept');

# pg_cancel_backend from another session, while the batch claims.
my $batch = long_session($node, 'postgres', extra_params => [ '-U', 'app' ], on_error_stop => 0);
my $pid = $batch->query_safe('SELECT pg_backend_pid()');
$batch->query_until(qr/started/, q{\echo started
SELECT count(*) FROM idempotency.claim_keys((SELECT keys FROM batches WHERE n = 1000000));
});
# Wait until it has claimed a key: its transaction has an ID once it wrote a row.
$inserted_before = inserted();
ok($node->poll_query_until('postgres',
    qq{SELECT backend_xid IS NOT NULL FROM pg_stat_activity WHERE pid = $pid}),
  'the batch claims keys');
$t0 = time;
$node->safe_psql('postgres', "SELECT pg_cancel_backend($pid)");
ok($node->poll_query_until('postgres', qq{SELECT state <> 'active' FROM pg_stat_activity WHERE pid = $pid}),
  'pg_cancel_backend ends claim_keys of 1,000,000 keys');
my $cancel = time - $t0;
note(sprintf('pg_cancel_backend: the batch stopped %.1f ms after the cancel', $cancel * 1000));
end_session($batch);
$inserted = inserted_once_app_left() - $inserted_before;
note("it had claimed $inserted keys");
cmp_ok($inserted, '>', 0, 'the cancel came while the batch claimed');
cmp_ok($inserted, '<', 1000000, 'and ended it before the batch could have finished (fewer than its million rows inserted)');

# Memory: the peak of a backend's private memory (RssAnon: shared buffers left out) while
# it claims 400,000 keys, against one that reads the same array and unnests it. Each starts
# fresh; the peak is sampled every millisecond while the statement runs (it was sampled
# between round trips of another session, which a loaded machine stretched to tens of
# milliseconds: the unnest's short peak went unseen).
sub peak_kb {
  my ($sql) = @_;
  my $session = long_session($node, 'postgres', extra_params => [ '-U', 'app' ]);
  my $pid = $session->query_safe('SELECT pg_backend_pid()');
  my $anon = sub {
    open my $status, '<', "/proc/$pid/status" or return 0;
    my ($kb) = map { /^RssAnon:\s+(\d+) kB/ ? $1 : () } <$status>;
    return $kb // 0;
  };
  my $peak = $anon->();
  $session->query_until(qr/started/, "\\echo started\n$sql;\n\\echo finished\n");
  # Sampled every millisecond until psql prints the statement's end (read without blocking:
  # no round trip of another session between two samples).
  my $deadline = time + 300;
  while (time < $deadline) {
    my $kb = $anon->();
    $peak = $kb if $kb > $peak;
    $session->{run}->pump_nb;
    last if $session->{stdout} =~ /finished/;
    usleep(1000);
  }
  end_session($session);
  return $peak;
}
my $unnest = peak_kb(q{SELECT count(*) FROM unnest((SELECT keys FROM batches WHERE n = 400000))});
my $claims = peak_kb(q{SELECT count(*) FROM idempotency.claim_keys((SELECT keys FROM batches WHERE n = 400000))});
note(sprintf('peak private memory: unnest of 400,000 keys %d kB, claim_keys of them %d kB (%+d kB)',
  $unnest, $claims, $claims - $unnest));
cmp_ok($claims - $unnest, '<', 16 * 1024,
  'claim_keys of 400,000 keys peaks within 16 MB of unnesting them (1.1: +40 MB of C++ containers here)');
is($node->safe_psql('postgres', q{SELECT count(*) FROM idempotency.idempotency_keys WHERE key LIKE 'r-%'}), '400000',
  'all 400,000 were claimed');

$node->stop;
done_testing();
