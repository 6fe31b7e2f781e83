# The cleanup worker deletes expired keys in every database where the extension is
# installed, leaves live and locked rows alone, notices CREATE EXTENSION in a new
# database, survives a failing round, and takes a new interval on SIGHUP.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# A background session's answer without the trailing newline that PostgreSQL 16.2's
# BackgroundPsql leaves on it (later versions strip it).
sub answer {
  my ($session, $sql) = @_;
  my $out = $session->query_safe($sql);
  $out =~ s/\s+\z//;
  return $out;
}
use Time::HiRes qw(time);

my $interval_ms = 200;

my $node = PostgreSQL::Test::Cluster->new('worker_cleanup');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempotency'
idempotency.cleanup_interval = '${interval_ms}ms'
idempotency.cleanup_batch_size = 1000
});
$node->start;

# Rows written directly (as superuser) with a chosen expiry: $n keys named prefix1..N.
sub add_keys {
  my ($db, $prefix, $n, $expires) = @_;
  $node->safe_psql($db, qq{
    INSERT INTO idempotency_keys (key, owner, ttl, lease, created_at, expires_at, updated_at)
    SELECT '$prefix' || g, current_user, '1 hour', '5 min', now() - interval '2 hours', $expires, now()
      FROM generate_series(1, $n) g});
}

sub count_keys {
  my ($db, $prefix) = @_;
  return $node->safe_psql($db,
    "SELECT count(*) FROM idempotency_keys WHERE key LIKE '$prefix%'");
}

# Waits until no key of $db starts with $prefix; true when that happened in time.
sub keys_gone {
  my ($db, $prefix) = @_;
  return $node->poll_query_until($db,
    "SELECT count(*) = 0 FROM idempotency_keys WHERE key LIKE '$prefix%'");
}

# Waits until $db's cleanup has run two more rounds than $runs.
sub two_more_rounds {
  my ($db, $runs) = @_;
  return $node->poll_query_until($db,
    "SELECT cleanup_runs >= $runs + 2 FROM idempotency_stats WHERE datname = '$db'");
}

sub stat_of {
  my ($db, $column) = @_;
  return $node->safe_psql($db,
    "SELECT $column FROM idempotency_stats WHERE datname = current_database()");
}

sub launcher_pid {
  return $node->safe_psql('postgres', q{
    SELECT pid FROM pg_stat_activity
     WHERE backend_type = 'idempotency cleanup launcher'});
}

# --- visible in pg_stat_activity -----------------------------------------------------

ok($node->poll_query_until('postgres', q{
  SELECT count(*) = 1 FROM pg_stat_activity
   WHERE backend_type = 'idempotency cleanup launcher'
     AND application_name = 'idempotency cleanup launcher' AND datid IS NULL}),
  'the launcher shows in pg_stat_activity, connected to no database');
my $launcher = launcher_pid();

# --- two databases at once -------------------------------------------------------------

for my $db ('alpha', 'beta') {
  $node->safe_psql('postgres', "CREATE DATABASE $db");
  $node->safe_psql($db, 'CREATE EXTENSION idempotency');
  add_keys($db, 'live', 50, q{now() + interval '1 hour'});
}

my $start = time();
add_keys('alpha', 'old', 5000, q{now() - interval '1 minute' + g * interval '1 ms'});
add_keys('beta', 'old', 3000, q{now() - interval '1 second'});
ok(keys_gone('alpha', 'old'),
  'expired keys disappear from the first database');
ok(keys_gone('beta', 'old'),
  'expired keys disappear from the second database');
my $elapsed = time() - $start;
diag(sprintf('8000 expired keys in two databases deleted after %.2f s (interval %d ms)',
  $elapsed, $interval_ms));
# Generous against a loaded machine, but far below what a worker that ignored the
# interval (default 60 s) would take.
cmp_ok($elapsed, '<', 15, 'both databases were served within a few intervals');

is(count_keys('alpha', 'live'), '50', 'live keys stay in the first database');
is(count_keys('beta', 'live'), '50', 'live keys stay in the second database');
is(stat_of('alpha', 'expired_deleted'), '5000', 'stats count the deleted keys (alpha)');
is(stat_of('beta', 'expired_deleted'), '3000', 'stats count the deleted keys (beta)');
is($node->safe_psql('alpha',
    q{SELECT count(*) FROM idempotency_stats WHERE datname = 'postgres'}),
  '0', 'a database without the extension gets no cleanup round');

# --- keys that expire within the next minute stay -----------------------------------------
# A key is expired when expires_at <= now(), and not a moment earlier: keys expiring 1 to
# 59 seconds from now must outlive every round that runs before their time. Their expiry
# times are kept aside (a deleted row says nothing), and after two more rounds every key
# that is still live at the check must be there.
$node->safe_psql('alpha', q{
  CREATE TABLE soon AS
    SELECT 'soon' || g AS key, clock_timestamp() + g * interval '1 second' AS expires_at
      FROM generate_series(1, 59) g;
  INSERT INTO idempotency_keys (key, owner, ttl, lease, created_at, expires_at, updated_at)
    SELECT key, current_user, '1 hour', '5 min', now(), expires_at, now() FROM soon});
my $soon_runs = stat_of('alpha', 'cleanup_runs');
ok(two_more_rounds('alpha', $soon_runs),
  'two more rounds ran after keys expiring within the next minute were added');
my ($still_live, $deleted_live) = split /\|/, $node->safe_psql('alpha', q{
  SELECT count(*), count(*) FILTER (WHERE NOT EXISTS (SELECT FROM idempotency_keys k WHERE k.key = s.key))
    FROM soon s WHERE s.expires_at > clock_timestamp()});
is($deleted_live, '0', "no key was deleted before its expiry ($still_live keys still live checked)");
# Two rounds of 200 ms take far less than the 30 s that would leave half the minute unchecked.
cmp_ok($still_live, '>=', 30, 'the check covered keys expiring across the minute');

# --- locked rows stay ---------------------------------------------------------------------

# The row is live when it gets locked (so no round can delete it first) and expires, a
# second later, while still locked.
add_keys('alpha', 'locked', 1, q{clock_timestamp() + interval '1 second'});
my $holder = $node->background_psql('alpha');
is(answer($holder, q{BEGIN; SELECT key FROM idempotency_keys WHERE key = 'locked1' FOR UPDATE}),
  'locked1', 'a session locks a key that is about to expire');
ok($node->poll_query_until('alpha',
    q{SELECT expires_at <= clock_timestamp() FROM idempotency_keys WHERE key = 'locked1'}),
  'the locked key has expired');
add_keys('alpha', 'after', 200, q{now() - interval '1 second'});
ok(keys_gone('alpha', 'after'),
  'keys expired after the locked one are deleted');
my $runs = stat_of('alpha', 'cleanup_runs');
ok(two_more_rounds('alpha', $runs),
  'two more rounds ran while the row was locked');
is(count_keys('alpha', 'locked'), '1', 'the locked expired row is skipped, not waited for');
$holder->query_safe('COMMIT');
$holder->quit;
ok($node->poll_query_until('alpha',
    q{SELECT count(*) = 0 FROM idempotency_keys WHERE key = 'locked1'}),
  'once unlocked, it is deleted by a later round');

# --- claim_key is never blocked by a cleanup ------------------------------------------------
# idempotency_cleanup() in a transaction that stays open (the janitor's BEGIN; SELECT
# idempotency_cleanup(); ... of issue #20): its deletions are committed by its own worker, so
# the janitor holds no lock on any key, and a claim of one of them by another role answers
# claimed at once (statement_timeout turns a wait into a failure). The background worker is
# kept out of alpha meanwhile, so that the janitor's call is what deletes the keys.
$node->safe_psql('postgres', 'CREATE ROLE app_alice');
# The keys that expire across the minute have served: left in place, those expiring between the
# pause below and the janitor's call would be deleted by that call too (on a slow machine).
$node->safe_psql('alpha', q{
  GRANT USAGE ON SCHEMA idempotency TO app_alice;
  DELETE FROM idempotency_keys WHERE key LIKE 'soon%';
  ALTER DATABASE alpha SET idempotency.cleanup_worker = off});
$node->safe_psql('alpha', q{
  INSERT INTO idempotency_keys (key, owner, ttl, lease, created_at, expires_at, updated_at)
  SELECT 'busy' || g, 'app_alice', '1 hour', '5 min', now() - interval '2 hours',
         now() - interval '1 second', now()
    FROM generate_series(1, 3) g});
my $cleaner = $node->background_psql('alpha');
is(answer($cleaner, q{BEGIN ISOLATION LEVEL SERIALIZABLE; SELECT idempotency_cleanup()}), '3',
  'the janitor deleted the three expired keys (its transaction stays open)');
# A claim blocked by the janitor's locks would wait for its COMMIT, which comes only after:
# the answer is the verdict (statement_timeout only bounds the run; the time is printed).
my $start_claim = time();
my ($rc, $status, $err) = $node->psql('alpha', q{
  SET statement_timeout = '60s';
  SET ROLE app_alice;
  SELECT status FROM claim_key('busy1', wait => '0')});
my $claim_took = time() - $start_claim;
is($rc, 0, 'claim_key of such a key is not blocked') or diag($err);
is($status, 'claimed', 'it is claimed afresh while the janitor\'s transaction is open');
note(sprintf('the claim took %.2f s', $claim_took));
$cleaner->query_safe('COMMIT');
$cleaner->quit;
$node->safe_psql('alpha', q{
  DELETE FROM idempotency_keys WHERE key LIKE 'busy%';
  ALTER DATABASE alpha RESET idempotency.cleanup_worker});

# --- keys of a dropped role ---------------------------------------------------------------
# Live keys stay while their role exists; once it is dropped the worker deletes them.
$node->safe_psql('postgres', 'CREATE ROLE gone_app');
$node->safe_psql('alpha', q{
  INSERT INTO idempotency_keys (key, owner, ttl, lease, created_at, expires_at, updated_at)
  SELECT 'orphan' || g, 'gone_app', '1 hour', '5 min', now(), now() + interval '1 hour', now()
    FROM generate_series(1, 20) g});
my $orphan_runs = stat_of('alpha', 'cleanup_runs');
ok(two_more_rounds('alpha', $orphan_runs), 'two more rounds ran while the role existed');
is(count_keys('alpha', 'orphan'), '20', 'the live keys of an existing role stay');
$node->safe_psql('postgres', 'DROP ROLE gone_app');
ok(keys_gone('alpha', 'orphan'), 'once the role is dropped, the worker deletes its live keys');
is(count_keys('alpha', 'live'), '50', 'the live keys of other roles stay');

# --- CREATE EXTENSION in a new database --------------------------------------------------

$node->safe_psql('postgres', 'CREATE DATABASE gamma');
$node->safe_psql('gamma', 'CREATE EXTENSION idempotency');
add_keys('gamma', 'old', 100, q{now() - interval '1 second'});
ok(keys_gone('gamma', 'old'),
  'a database created later, with CREATE EXTENSION, is picked up without a restart');

# DROP EXTENSION and CREATE EXTENSION again (a new table OID) in a served database.
$node->safe_psql('gamma', 'DROP EXTENSION idempotency');
$node->safe_psql('gamma', 'CREATE EXTENSION idempotency');
add_keys('gamma', 'again', 100, q{now() - interval '1 second'});
ok(keys_gone('gamma', 'again'),
  'DROP and CREATE EXTENSION are noticed too');

# --- a failing round is logged, recorded, and retried ------------------------------------
# A superuser's session holds ACCESS EXCLUSIVE on beta's table: every batch gives up after
# the worker's own lock_timeout (whatever the database's settings), the round is recorded as
# failed and tried again at the next interval.
$node->safe_psql('beta', q{ALTER DATABASE beta SET lock_timeout = 0});
# The worker leaves beta alone until the lock is held: a round between the insertion and the
# lock would delete the keys first (one run in two did on a loaded machine).
$node->safe_psql('beta', q{ALTER DATABASE beta SET idempotency.cleanup_worker = off});
add_keys('beta', 'stuck', 10, q{now() - interval '1 second'});
my $locker = $node->background_psql('beta');
$locker->query_safe('BEGIN; LOCK TABLE idempotency.idempotency_keys IN ACCESS EXCLUSIVE MODE');
$node->safe_psql('postgres', q{ALTER DATABASE beta RESET idempotency.cleanup_worker});
ok($node->poll_query_until('beta',
    q{SELECT last_error LIKE '%lock timeout%' FROM idempotency_stats WHERE datname = 'beta'}),
  'the error of a failing round shows in idempotency_stats.last_error');
$runs = stat_of('beta', 'cleanup_runs');
ok(two_more_rounds('beta', $runs),
  'later rounds keep trying');
is(answer($locker, q{SELECT count(*) FROM idempotency_keys WHERE key LIKE 'stuck%'}), '10',
  'nothing was deleted while the rounds failed');
ok($node->log_contains(qr/idempotency cleanup of database \d+ failed: canceling statement due to lock timeout/),
  'the failure is in the server log');
is(launcher_pid(), $launcher, 'the launcher did not restart (no crash loop)');
$locker->query_safe('COMMIT');
$locker->quit;
ok(keys_gone('beta', 'stuck'),
  'once the cause is gone, the next round deletes the keys');
ok($node->poll_query_until('beta',
    q{SELECT last_error IS NULL FROM idempotency_stats WHERE datname = 'beta'}),
  'and a successful round clears last_error');
$node->safe_psql('beta', q{ALTER DATABASE beta RESET lock_timeout});

# --- a database without the extension costs nothing after the first look ------------------
# Each look is a worker connecting to the database: its transactions show in
# pg_stat_database.xact_commit. After the first, none while alpha's rounds go on; a CREATE
# EXTENSION idempotency there is noticed at once (not after the back-off of minutes).
$node->safe_psql('postgres', 'CREATE DATABASE empty');
ok($node->poll_query_until('postgres',
    q{SELECT xact_commit > 0 FROM pg_stat_database WHERE datname = 'empty'}),
  'the new database without the extension gets a first look');
$runs = stat_of('alpha', 'cleanup_runs');
ok($node->poll_query_until('alpha', "SELECT cleanup_runs >= $runs + 2 FROM idempotency_stats WHERE datname = 'alpha'"),
  'two more rounds in alpha');
my $looked = $node->safe_psql('postgres', q{SELECT xact_commit FROM pg_stat_database WHERE datname = 'empty'});
$runs = stat_of('alpha', 'cleanup_runs');
ok($node->poll_query_until('alpha', "SELECT cleanup_runs >= $runs + 5 FROM idempotency_stats WHERE datname = 'alpha'"),
  'five more rounds in alpha');
is($node->safe_psql('postgres', q{SELECT xact_commit FROM pg_stat_database WHERE datname = 'empty'}),
  $looked, 'meanwhile no worker connected to the database without the extension');
$node->safe_psql('empty', 'CREATE EXTENSION idempotency');
add_keys('empty', 'old', 100, q{now() - interval '1 second'});
ok(keys_gone('empty', 'old'), 'after CREATE EXTENSION there, its keys are cleaned at once');

# --- SIGHUP: a new interval takes effect ----------------------------------------------

$node->safe_psql('postgres', q{ALTER SYSTEM SET idempotency.cleanup_interval = '10min'});
$node->reload;
ok($node->poll_query_until('alpha', q{SELECT current_setting('idempotency.cleanup_interval') = '10min'}),
  'the new interval is visible to new sessions');
# SIGHUP sets the launcher's latch: it reloads at once (a round already started may still
# finish). Then no round runs for 10 minutes: over a window of 1.5 s (7 old intervals)
# expired keys stay and cleanup_runs stands still. The window observes an absence; it is
# not a synchronization.
my $before = stat_of('alpha', 'cleanup_runs');
$node->safe_psql('postgres', 'SELECT pg_sleep(1.5)');
cmp_ok(stat_of('alpha', 'cleanup_runs'), '<=', $before + 1, 'with a 10 min interval, rounds stop');
$before = stat_of('alpha', 'cleanup_runs');
add_keys('alpha', 'slow', 10, q{now() - interval '1 second'});
$node->safe_psql('postgres', 'SELECT pg_sleep(1.5)');
is(stat_of('alpha', 'cleanup_runs'), $before, 'no round ran in the next 1.5 s');
is(count_keys('alpha', 'slow'), '10', 'expired keys wait for the next round');

$node->safe_psql('postgres', q{ALTER SYSTEM SET idempotency.cleanup_interval = '200ms'});
$start = time();
$node->reload;
ok(keys_gone('alpha', 'slow'),
  'after SIGHUP with a short interval, the launcher wakes up and deletes them');
$elapsed = time() - $start;
cmp_ok($elapsed, '<', 60, 'well before the old 10 min interval would have ended');

is(launcher_pid(), $launcher, 'the same launcher process served the whole test');
$node->stop;
done_testing();
