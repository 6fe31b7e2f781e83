# No role can stall the cleanup (issue #32, item 2). A role with LOGIN alone, connected to
# `postgres`, sets its own password again and again (each time a pg_authid change that every
# process learns of) while the worker cleans a table of 300,000 keys in another database: the
# keys that expire meanwhile are deleted while the attack goes on, and the password changes
# start no pass over the keys of dropped roles. Then a DROP ROLE does start one, which deletes
# the dropped role's keys. The verdicts are events: the keys gone while the attacker's loop
# still runs (pg_stat_activity), the worker's rounds and passes in idempotency_stats. How many
# rounds the deletion took is printed, not judged: a round ends after a second of work, so the
# count depends on the machine's speed (under load the throttle's batches of a busy server
# spread 2,000 keys over more than two rounds; the bug this guards against deleted none for as
# long as the attack lasted). The attacker's pace (a short sleep between changes) is no part
# of any verdict.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemCleanup;

my $node = cleanup_node('cleanup_churn');

# 300,000 live keys of 30 roles.
$node->safe_psql('app', q{
  DO $$ BEGIN
    FOR i IN 1 .. 30 LOOP EXECUTE format('CREATE ROLE %I', 'owner' || i); END LOOP;
  END $$});
insert_keys($node, q{SELECT 'owner' || (g % 30 + 1) AS r, g FROM generate_series(1, 300000) g});
ok(more_rounds($node, 2), 'the worker runs rounds');
# Every database gets a first pass over the keys of dropped roles at its first round. When
# that round came after the insertion, the pass over the 300,000 keys may still be under way
# (a pass resumes from round to round): wait for its end, so that the passes counted from here
# are only those that the changes below start (it ended after the count 1 in 4 runs).
ok($node->poll_query_until('app',
    q{SELECT orphan_passes >= 1 FROM idempotency.idempotency_stats WHERE datname = 'app'}),
  'the first pass is done');
my $passes = stat_of($node, 'orphan_passes');

# The attacker: LOGIN and nothing else, in `postgres`, changing its password until told to
# stop (at most 100,000 times: far longer than any run of this test).
my $attacker = start_churn($node, 'LOGIN', 100000,
  q{EXECUTE format('ALTER ROLE CURRENT_USER PASSWORD %L', 'secret' || i)});
my $churning = q{SELECT count(*) FROM pg_stat_activity
                  WHERE usename = 'churner' AND state = 'active' AND query LIKE 'CALL churn()%'};
my $password = sub {
  $node->safe_psql('postgres', q{SELECT rolpassword FROM pg_authid WHERE rolname = 'churner'});
};
my $before = $password->();
ok($node->poll_query_until('postgres',
    "SELECT rolpassword IS DISTINCT FROM '$before' FROM pg_authid WHERE rolname = 'churner'"),
  'the attacker changes its password');

# 2,000 keys expire now; they go while the attack goes on.
is($node->safe_psql('app', q{
  WITH expired AS (UPDATE idempotency.idempotency_keys SET expires_at = now() - interval '1 second'
                    WHERE key IN (SELECT 'k' || g FROM generate_series(1, 300000, 150) g) RETURNING 1)
  SELECT count(*) FROM expired}), '2000', '2,000 keys expire');
my $from = stat_of($node, 'cleanup_runs');
my $changing = $password->();
ok($node->poll_query_until('app',
    q{SELECT count(*) = 0 FROM idempotency.idempotency_keys WHERE expires_at <= now()}),
  'the expired keys are deleted, whatever the attacker does');
diag('rounds it took: ' . (stat_of($node, 'cleanup_runs') - $from));
is($node->safe_psql('postgres', $churning), '1', 'while the attacker was still at it');
isnt($password->(), $changing, 'changing its password all along');
ok(more_rounds($node, 3), 'more rounds under the attack');
is(stat_of($node, 'orphan_passes'), $passes, 'password changes start no pass over the keys of dropped roles');
is($node->safe_psql('app', 'SELECT count(*) FROM idempotency.idempotency_keys'), '298000',
  'and no live key went');

# A DROP ROLE under the same attack: the pass it starts ends, and the role's keys go.
$node->safe_psql('postgres', 'DROP ROLE owner7');
ok($node->poll_query_until('app',
    "SELECT orphan_passes > $passes FROM idempotency.idempotency_stats WHERE datname = 'app'"),
  'a DROP ROLE starts a pass, which ends under the attack');
is($node->safe_psql('app', q{SELECT count(*) FROM idempotency.idempotency_keys WHERE owner = 'owner7'}),
  '0', "the dropped role's keys are deleted");
is($node->safe_psql('postgres', $churning), '1', 'the attacker was at it throughout');

stop_churn($node, $attacker);
$node->stop;
done_testing();
