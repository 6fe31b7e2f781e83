# No database's settings or open transactions stall the cleanup (issue #20, item 5).
#
# A non-superuser database owner sets up his four databases as the review did:
# ALTER DATABASE ... SET default_transaction_isolation = 'serializable',
# default_transaction_read_only = on, default_transaction_deferrable = on, timeouts that
# would make a worker wait forever (lock_timeout = 0) or fail every batch (statement_timeout
# and idle_in_transaction_session_timeout of 1 ms), and more settings that would steer a
# worker (a role of his, tiny work_mem, no index scans, his search_path), and keeps a
# SERIALIZABLE transaction open. A worker that took those settings waited for a
# safe snapshot, which his open transaction delays for as long as he likes, and four such
# workers held every slot of the launcher: expired keys of a victim database stayed. Now
# each worker pins what it needs and undoes what a database or role set: the victim's keys
# go within a few intervals, his own database with the extension is cleaned too (the
# read-only default did not stick), and no worker stays in his databases.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $interval_ms = 200;
# The test's own sessions (his included) override his timeouts from the connection on, as
# he can for his: else a query of the test there would be cancelled after 1 ms.
$ENV{PGOPTIONS} = '-c statement_timeout=0 -c idle_in_transaction_session_timeout=0';

my $node = PostgreSQL::Test::Cluster->new('worker_stall');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempotency'
idempotency.cleanup_interval = '${interval_ms}ms'
});
$node->start;

sub psql_as {
  my ($role, $db, $sql) = @_;
  return $node->safe_psql($db, $sql, extra_params => [ '-U', $role ]);
}

# His settings hold for the test's own sessions in his databases too: they take this first
# (else a query of the test there waits for a safe snapshot, as the workers did).
my $unsteered = q{SET ROLE NONE; SET default_transaction_isolation = 'read committed';
  SET default_transaction_read_only = off; SET default_transaction_deferrable = off;};

sub add_expired {
  my ($db, $prefix, $n) = @_;
  $node->safe_psql($db, qq{
    $unsteered
    INSERT INTO idempotency.idempotency_keys (key, owner, ttl, lease, created_at, expires_at, updated_at)
    SELECT '$prefix' || g, current_user, '1 hour', '5 min', now() - interval '2 hours',
           now() - interval '1 second', now()
      FROM generate_series(1, $n) g});
}


# poll_query_until for his databases (safe_psql is quiet about the command tags of the
# settings).
sub poll_as_superuser {
  my ($db, $query) = @_;
  my $deadline = time() + $PostgreSQL::Test::Utils::timeout_default;
  while (time() < $deadline) {
    return 1 if $node->safe_psql($db, "$unsteered $query") eq 't';
    select(undef, undef, undef, 0.1);
  }
  return 0;
}

$node->safe_psql('postgres', q{
  CREATE ROLE mallory LOGIN CREATEDB;
  CREATE DATABASE victim;
});
$node->safe_psql('victim', 'CREATE EXTENSION idempotency');

# His four databases; the fourth has the extension (a superuser installed it for him).
for my $i (1 .. 4) {
  psql_as('mallory', 'postgres', "CREATE DATABASE m$i");
  $node->safe_psql('m4', 'CREATE EXTENSION idempotency') if $i == 4;
  psql_as('mallory', "m$i", qq{
    ALTER DATABASE m$i SET default_transaction_isolation = 'serializable';
    ALTER DATABASE m$i SET default_transaction_read_only = on;
    ALTER DATABASE m$i SET default_transaction_deferrable = on;
    ALTER DATABASE m$i SET lock_timeout = 0;
    ALTER DATABASE m$i SET statement_timeout = '1ms';
    ALTER DATABASE m$i SET idle_in_transaction_session_timeout = '1ms';
    ALTER DATABASE m$i SET work_mem = '64kB';
    ALTER DATABASE m$i SET enable_indexscan = off;
    ALTER DATABASE m$i SET enable_bitmapscan = off;
    ALTER DATABASE m$i SET role = 'mallory';
    ALTER DATABASE m$i SET search_path = 'mallory_schema';});
}
is($node->safe_psql('postgres', q{
    SELECT string_agg(unnest, ' ' ORDER BY unnest) FROM pg_db_role_setting s
      JOIN pg_database d ON d.oid = s.setdatabase, unnest(s.setconfig)
     WHERE d.datname = 'm1' AND s.setrole = 0 AND unnest ~ '^(default_transaction|.*timeout)'}),
  'default_transaction_deferrable=on default_transaction_isolation=serializable '
    . 'default_transaction_read_only=on idle_in_transaction_session_timeout=1ms lock_timeout=0 '
    . 'statement_timeout=1ms',
  'the owner set the three defaults of the review and the timeouts on his databases');

# His open SERIALIZABLE transaction, which any wait for a safe snapshot waits for.
my $open = $node->background_psql('m1', extra_params => [ '-U', 'mallory' ]);
$open->query_safe('BEGIN ISOLATION LEVEL SERIALIZABLE READ WRITE; SELECT 1');
my $holder = $node->safe_psql('postgres', q{
  SELECT pid FROM pg_stat_activity WHERE usename = 'mallory' AND state = 'idle in transaction'});
like($holder, qr/^\d+$/, 'his serializable transaction is open');

sub victim_stat {
  my ($column) = @_;
  return $node->safe_psql('victim', qq{
    SELECT coalesce(${column}::text, 'none') FROM idempotency.idempotency_stats WHERE datname = 'victim'});
}

my $start = time();
my $inserted_at = $node->safe_psql('victim', 'SELECT clock_timestamp()');
add_expired('victim', 'old', 50);
add_expired('m4', 'his', 50);
ok($node->poll_query_until('victim', 'SELECT count(*) = 0 FROM idempotency.idempotency_keys'),
  "the victim database's expired keys are deleted");
my $elapsed = time() - $start;
diag(sprintf('50 expired keys of the victim deleted after %.2f s (interval %d ms)', $elapsed,
  $interval_ms));
# A stalled worker never gets there at all: the poll above is the verdict (it only bounds the
# run); the time is printed, not judged.
is($node->safe_psql('victim', qq{
    SELECT last_cleanup > '$inserted_at' FROM idempotency.idempotency_stats WHERE datname = 'victim'}),
  't', "the victim's last_cleanup is after the keys were added");
ok(poll_as_superuser('m4', 'SELECT count(*) = 0 FROM idempotency.idempotency_keys'),
  "his own database's expired keys are deleted too (read-write, whatever he set)");
is($node->safe_psql('m4', qq{
    $unsteered SELECT coalesce(last_error, '') FROM idempotency.idempotency_stats WHERE datname = 'm4'}),
  '', 'without an error');
is($node->safe_psql('postgres', "SELECT state FROM pg_stat_activity WHERE pid = $holder"),
  'idle in transaction', 'his serializable transaction was open all along');

# Positive evidence that workers kept running: two more rounds in the victim database, and
# none of his databases holds a worker at that point or waits for a snapshot.
my $runs = victim_stat('cleanup_runs');
my $last = victim_stat('last_cleanup');
ok($node->poll_query_until('victim', qq{
    SELECT cleanup_runs >= $runs + 2 FROM idempotency.idempotency_stats WHERE datname = 'victim'}),
  'rounds go on in the victim database');
is($node->safe_psql('victim', qq{
    SELECT last_cleanup > '$last' FROM idempotency.idempotency_stats WHERE datname = 'victim'}),
  't', 'and last_cleanup advances');
ok($node->poll_query_until('postgres', q{
    SELECT count(*) = 0 FROM pg_stat_activity
     WHERE backend_type LIKE 'idempotency cleanup%' AND datname ~ '^m[1-4]$'}),
  'no worker stays in his databases');
is($node->safe_psql('postgres', q{
    SELECT count(*) FROM pg_stat_activity
     WHERE backend_type LIKE 'idempotency cleanup%' AND wait_event = 'SafeSnapshot'}),
  '0', 'no worker waits for a safe snapshot');
ok(!$node->log_contains(qr/idempotency cleanup of database \d+ failed/),
  'no round failed');

$open->query_safe('COMMIT');
$open->quit;
$node->stop;
done_testing();
