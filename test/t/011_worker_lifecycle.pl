# The cleanup worker's life: DROP DATABASE of a served database completes promptly; a
# database worker runs at the server's priority; pg_cancel_backend() restarts the launcher,
# which then finds the workers still running and starts no second one for their databases;
# after kill -9 the postmaster restarts it and cleanup resumes; SIGTERM stops it quietly for
# good; a server restart brings it back, and neither a restart nor a fast shutdown (with
# workers in the middle of a round) logs anything above LOG or is held up.
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
# One key per transaction: a round over the 300000 keys below would take many seconds, so
# the DROP DATABASE test shows that a round stops after the batch under way when a command
# wants the database alone (and the next one waits to enter) instead of keeping its
# connection to the database for its 10 s.
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

# The nice value of a process (field 19 of /proc/PID/stat, counted after the command name,
# which may hold spaces); undef once the process is gone.
sub nice_of {
  my ($pid) = @_;
  open(my $fh, '<', "/proc/$pid/stat") or return undef;
  my $stat = <$fh>;
  close $fh;
  my ($after) = $stat =~ /\)\s(.*)$/ or return undef;
  return (split / /, $after)[16];
}

# A database worker of $db runs at the postmaster's nice value (no priority games while it
# holds buffer and WAL locks that claims wait for). Workers come and go every round: take
# the next one until its nice value could be read.
sub worker_priority_is_the_servers {
  my ($db) = @_;
  my $postmaster = (split /\n/, slurp_file($node->data_dir . '/postmaster.pid'))[0];
  my ($nice, $pid);
  for (1 .. 200) {
    $pid = $node->safe_psql('postgres', qq{
      SELECT pid FROM pg_stat_activity WHERE backend_type = 'idempotency cleanup' AND datname = '$db' LIMIT 1});
    next if $pid eq '';
    $nice = nice_of($pid);
    last if defined $nice;
  }
  ok(defined $nice, "a database worker of $db caught running (pid $pid)");
  is($nice, nice_of($postmaster), "it runs at the postmaster's nice value (" . ($nice // '?') . ')');
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
# and quickly, while the worker is busy deleting 300000 keys one by one (about 20 s of work
# at 15,000 keys a second, more than a round of up to 10 s, which leaves after the batch under
# way when a command wants the database alone; with 30000 keys the work itself ended within
# 2 s, and a worker that stayed for its round went unseen). ALTER DATABASE RENAME and CREATE DATABASE from a template wait for the
# other connections in the same way: one served database is renamed, one copied, first.
for my $i (1 .. 5) {
  $node->safe_psql('postgres', "CREATE DATABASE served$i");
  $node->safe_psql("served$i", 'CREATE EXTENSION idempotency');
  add_expired("served$i", 'old', 300000);
  $node->poll_query_until("served$i", q{
    SELECT count(*) > 0 FROM pg_stat_activity
     WHERE backend_type = 'idempotency cleanup' AND datname = current_database()})
    or diag("no worker seen in served$i before the drop");
  worker_priority_is_the_servers("served$i") if $i == 1;
  if ($i == 2) {
    my ($rc, $out, $err) = $node->psql('postgres', "ALTER DATABASE served2 RENAME TO renamed2");
    is($rc, 0, 'ALTER DATABASE RENAME of a served database succeeds while the worker serves it')
      or diag($err);
    $node->safe_psql('postgres', 'ALTER DATABASE renamed2 RENAME TO served2') if $rc == 0;
    $node->poll_query_until('served2', q{
      SELECT count(*) > 0 FROM pg_stat_activity
       WHERE backend_type = 'idempotency cleanup' AND datname = current_database()})
      or diag('no worker seen in served2 after the renames');
  }
  if ($i == 3) {
    my ($rc, $out, $err) = $node->psql('postgres', 'CREATE DATABASE copy3 TEMPLATE served3');
    is($rc, 0, 'CREATE DATABASE from a served database succeeds while the worker serves it')
      or diag($err);
    $node->safe_psql('postgres', 'DROP DATABASE IF EXISTS copy3');
  }
  my $start = time();
  my ($rc, $out, $err) = $node->psql('postgres', "DROP DATABASE served$i");
  my $took = time() - $start;
  # DROP DATABASE waits up to 5 s for other connections, then fails: its success is the
  # verdict that the worker left within a round (the time is printed, not judged).
  is($rc, 0, "DROP DATABASE served$i succeeds while the worker serves it")
    or diag($err);
  note(sprintf('DROP DATABASE served%d took %.2f s', $i, $took));
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

# --- SIGINT: the launcher starts again and finds the workers still running ----------------
# pg_cancel_backend() of the launcher makes it exit (code 1: the postmaster starts a new one
# a second later) while its database workers run on. Database 'big' has 1,500,000 expired
# keys and batches of a million: a batch of its worker takes seconds. The new launcher serves the
# other databases at once but must not start a second worker for 'big' while the first runs:
# the registry in shared memory tells it (the old launcher's handles are gone with it).
$node->safe_psql('postgres', q{ALTER SYSTEM SET idempotency.cleanup_batch_size = 1000000});
$node->reload;
$node->safe_psql('postgres', 'CREATE DATABASE big');
$node->safe_psql('big', 'CREATE EXTENSION idempotency');
add_expired('big', 'old', 1500000);
my $first = '';
# (The worker reports its batch as its query.)
$node->poll_query_until('postgres', q{
  SELECT count(*) = 1 FROM pg_stat_activity
   WHERE backend_type = 'idempotency cleanup' AND datname = 'big'
     AND query = 'idempotency cleanup: deleting a batch of expired keys'})
  or diag('no worker seen deleting in big');
# Its pid, whatever it reports by now (between two queries it may have moved on to the pause
# after its batch: a filter on its query could then find nobody).
$first = $node->safe_psql('postgres', q{
  SELECT pid FROM pg_stat_activity WHERE backend_type = 'idempotency cleanup' AND datname = 'big'});
my $old_launcher = launcher_pid();
my $log_offset = -s $node->logfile;
my $cancelled = time();
is($node->safe_psql('postgres', "SELECT pg_cancel_backend($old_launcher)"), 't',
  'pg_cancel_backend() of the launcher');
ok($node->poll_query_until('postgres', qq{
    SELECT count(*) = 1 FROM pg_stat_activity
     WHERE backend_type = 'idempotency cleanup launcher' AND pid <> $old_launcher}),
  'a new launcher runs');
add_expired('keep', 'restarted', 100);
ok(wait_cleaned('keep', 'restarted'), 'it serves the other databases');
diag(sprintf("big's first worker %s still runs %.1f s after the cancel", $first, time() - $cancelled));
my $workers = $node->safe_psql('postgres', q{
  SELECT string_agg(pid::text, ',') FROM pg_stat_activity
   WHERE backend_type = 'idempotency cleanup' AND datname = 'big'});
SKIP: {
  skip "big's first worker ended before the new launcher's round (a very fast machine)", 1
    unless $first ne '' && $workers =~ /\b$first\b/;
  is($workers, $first, "while big's first worker still runs, it is big's only worker");
}
ok(wait_cleaned('big', 'old'), "and big's backlog goes");
ok($node->log_contains(qr/LOG:  idempotency cleanup launcher restarting on request/, $log_offset),
  'the restart is logged at LOG');
ok(!$node->log_contains(qr/(FATAL|ERROR|PANIC):.*(idempotency|canceling)/, $log_offset),
  'and nothing above LOG');
$node->safe_psql('postgres', q{ALTER SYSTEM RESET idempotency.cleanup_batch_size});
$node->reload;

# --- kill -9 ------------------------------------------------------------------------------

my $pid = launcher_pid();
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
# A worker lives up to 10 s; on a loaded machine the one found may have ended before the
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

# --- SIGTERM: the launcher stops, quietly, for good --------------------------------------
# As pg_cron's launcher does: exit code 0, which the postmaster takes as "do not restart";
# the next server start brings it back.
$pid = launcher_pid();
like($pid, qr/^\d+$/, 'launcher pid');
$log_offset = -s $node->logfile;
my $start = time();
kill 'TERM', $pid;
ok($node->poll_query_until('postgres',
    "SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $pid"),
  'the launcher exits on SIGTERM');
my $took = time() - $start;
note(sprintf('the launcher exited %.2f s after SIGTERM', $took));
# An observation window of three restart delays (the postmaster restarted it within a second
# after SIGINT above): not a synchronization.
$node->safe_psql('postgres', 'SELECT pg_sleep(3)');
is($node->safe_psql('postgres', q{
    SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'idempotency cleanup launcher'}),
  '0', 'and is not started again');
ok($node->log_contains(qr/LOG:  idempotency cleanup launcher stopping/, $log_offset),
  'its stop is logged at LOG');
ok(!$node->log_contains(qr/(FATAL|ERROR|PANIC):|"idempotency[^"]*" .*exited with exit code/, $log_offset),
  'nothing above LOG, and no exit code');

# --- a server restart, and a fast shutdown, with workers in the middle of a round ----------
# 20,000 expired keys deleted one per transaction keep a database worker busy for seconds.
add_expired('keep', 'busy', 20000);
$log_offset = -s $node->logfile;
$node->restart;
ok($node->poll_query_until('postgres', q{
  SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'idempotency cleanup launcher'}),
  'the restarted server runs the launcher again');
ok($node->poll_query_until('postgres', q{
  SELECT count(*) = 1 FROM pg_stat_activity
   WHERE backend_type = 'idempotency cleanup' AND datname = 'keep' AND state = 'active'}),
  'a database worker is in the middle of a round');
# The stop succeeds within pg_ctl's own wait with a worker in the middle of its round (one
# that ignored the shutdown would make it fail); the time is printed, not judged (it was a
# 5 s bound, which a loaded machine can break).
$start = time();
$node->stop('fast');
$took = time() - $start;
note(sprintf('the fast shutdown took %.2f s', $took));
# (PostgreSQL 15's own logical replication launcher exits with code 1 at every shutdown.)
# A session of this test still connected at the fast shutdown (the last poll's psql may not
# have left yet) is terminated with a FATAL under the test's application name: that is the
# server ending a client, not the extension, so those lines are not counted.
my $own_sessions = qr/\Q$ENV{PGAPPNAME}\E/;
my @above = grep { !/$own_sessions/ && /(FATAL|ERROR|PANIC|WARNING):|terminating background worker|"idempotency[^"]*" .*exited with exit code [^0]/ }
  split /\n/, substr(slurp_file($node->logfile), $log_offset);
is(join("\n", @above), '', 'the restart and the shutdown logged nothing above LOG');
done_testing();
