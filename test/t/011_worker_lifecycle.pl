# The cleanup worker's life: DROP DATABASE of a served database completes promptly, the
# launcher stops within a second on SIGTERM and is started again, and after kill -9 the
# postmaster restarts it and cleanup resumes. Server shutdown is not held up either.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $node = PostgreSQL::Test::Cluster->new('worker_lifecycle');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.cleanup_interval = '100ms'
# One key per transaction: a round over the 30000 keys below would take many seconds, so
# the DROP DATABASE test shows that a round stops after about a second (and the next one
# starts at once) instead of keeping its connection to the database.
idempotency.cleanup_batch_size = 1
idempotency.cleanup_delay = 0
# Cluster.pm turns it off; the crash-restart cycle is what kill -9 tests here.
restart_after_crash = on
});
$node->start;

sub launcher_pid {
  return $node->safe_psql('postgres', q{
    SELECT pid FROM pg_stat_activity
     WHERE backend_type = 'idempotency cleanup launcher'});
}

sub add_expired {
  my ($db, $prefix, $n) = @_;
  $node->safe_psql($db, qq{
    INSERT INTO idempotency_keys (key, owner, ttl, lease, created_at, expires_at, updated_at)
    SELECT '$prefix' || g, current_user, '1 hour', '5 min', now() - interval '2 hours',
           now() - interval '1 second', now()
      FROM generate_series(1, $n) g});
}

# poll_query_until, retried while the server reinitializes after a crash (psql can then
# die on a broken pipe before it reads its query).
sub poll_through_restart {
  my ($db, $query) = @_;
  my $deadline = time() + $PostgreSQL::Test::Utils::timeout_default;
  while (time() < $deadline) {
    my $done = eval { $node->poll_query_until($db, $query) };
    return 1 if $done;
    select(undef, undef, undef, 0.1);
  }
  return 0;
}

sub wait_cleaned {
  my ($db, $prefix) = @_;
  return $node->poll_query_until($db,
    "SELECT count(*) = 0 FROM idempotency_keys WHERE key LIKE '$prefix%'");
}

ok($node->poll_query_until('postgres', q{
  SELECT count(*) = 1 FROM pg_stat_activity
   WHERE backend_type = 'idempotency cleanup launcher'}), 'the launcher runs');

# --- DROP DATABASE of a served database ----------------------------------------------
# Every 100 ms a worker connects to each database for one round. DROP DATABASE (without
# FORCE) fails after 5 s if another process stays connected: each drop below must succeed,
# and quickly, while the worker is busy deleting 30000 keys one by one (about 10 s of
# work, split into rounds of about a second).
for my $i (1 .. 5) {
  $node->safe_psql('postgres', "CREATE DATABASE served$i");
  $node->safe_psql("served$i", 'CREATE EXTENSION idempotency');
  add_expired("served$i", 'old', 30000);
  $node->poll_query_until("served$i", q{
    SELECT count(*) > 0 FROM pg_stat_activity
     WHERE backend_type = 'idempotency cleanup' AND datname = current_database()})
    or diag("no worker seen in served$i before the drop");
  my $start = time();
  my ($rc, $out, $err) = $node->psql('postgres', "DROP DATABASE served$i");
  my $took = time() - $start;
  is($rc, 0, "DROP DATABASE served$i succeeds while the worker serves it")
    or diag($err);
  cmp_ok($took, '<', 4, sprintf('... and waits at most for the end of a round (%.2f s)', $took));
}
is($node->safe_psql('postgres',
    q{SELECT count(*) FROM pg_database WHERE datname LIKE 'served%'}),
  '0', 'every served database is gone');

$node->safe_psql('postgres', 'CREATE DATABASE keep');
$node->safe_psql('keep', 'CREATE EXTENSION idempotency');
add_expired('keep', 'first', 100);
ok(wait_cleaned('keep', 'first'), 'cleanup goes on in the remaining databases');
is($node->safe_psql('keep', q{
    SELECT count(*) FROM idempotency_stats WHERE database IS NOT NULL AND datname IS NULL}),
  '0', 'statistics of dropped databases are forgotten');

# --- SIGTERM ----------------------------------------------------------------------------

my $pid = launcher_pid();
like($pid, qr/^\d+$/, 'launcher pid');
my $start = time();
kill 'TERM', $pid;
ok($node->poll_query_until('postgres',
    "SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $pid"),
  'the launcher exits on SIGTERM');
my $took = time() - $start;
cmp_ok($took, '<', 1, sprintf('within a second (%.2f s)', $took));
ok($node->poll_query_until('postgres', qq{
    SELECT count(*) = 1 FROM pg_stat_activity
     WHERE backend_type = 'idempotency cleanup launcher' AND pid <> $pid}),
  'the postmaster starts it again (bgw_restart_time)');
add_expired('keep', 'second', 100);
ok(wait_cleaned('keep', 'second'), 'and cleanup goes on');

# --- kill -9 ------------------------------------------------------------------------------

$pid = launcher_pid();
kill 'KILL', $pid;
# A killed process with shared memory access makes the postmaster reinitialize: wait for
# the server to take connections again, then for the new launcher.
ok(poll_through_restart('postgres', qq{
    SELECT count(*) = 1 FROM pg_stat_activity
     WHERE backend_type = 'idempotency cleanup launcher' AND pid <> $pid}),
  'after kill -9 the launcher comes back');
add_expired('keep', 'third', 100);
ok(wait_cleaned('keep', 'third'), 'and cleanup resumes');

# Killing a database worker in the middle of a round: a worker is caught while rows remain.
# A worker lives about a second; on a loaded machine the one found may have ended before the
# signal reaches it (kill then signals no process): take the next one until a kill lands,
# so that the verdict below never depends on the machine's speed.
add_expired('keep', 'fourth', 5000);
my $worker = '';
my $launcher_before = launcher_pid();
for (1 .. 200) {
  $worker = $node->safe_psql('keep', q{
    SELECT pid FROM pg_stat_activity
     WHERE backend_type = 'idempotency cleanup' AND datname = 'keep' LIMIT 1});
  next if $worker eq '';
  last if kill('KILL', $worker) == 1;
  $worker = '';
}
SKIP: {
  skip 'no database worker caught running', 2 if $worker eq '';
  ok(poll_through_restart('postgres', qq{
      SELECT count(*) = 1 FROM pg_stat_activity
       WHERE backend_type = 'idempotency cleanup launcher' AND pid <> $launcher_before}),
    'after kill -9 of a database worker the launcher is back');
  ok(wait_cleaned('keep', 'fourth'), 'and the interrupted cleanup completes');
}

# --- shutdown -----------------------------------------------------------------------------

$start = time();
$node->stop('fast');
$took = time() - $start;
cmp_ok($took, '<', 5, sprintf('a fast shutdown is not held up by the worker (%.2f s)', $took));
done_testing();
