# A pass over the keys of dropped roles gets through under any churn of roles (issue #32,
# item 2). A role with CREATEROLE creates and drops a role of its own again and again: each
# drop is a change that can orphan keys and makes a pass due. A pass that such a change
# overtakes goes on from the block it reached (and comes round to it again) instead of starting
# over from block 0, so the keys of a role dropped at the start, stored at the end of the heap,
# are reached and deleted while the drops go on. A liveness check: how fast the drops come
# against the worker's rounds depends on the machine, and a pass that restarted from block 0
# also got through here when the drops left some rounds alone; test/t/054_orphan_pass_order.pl
# shows the order step by step (it kills the mutant pass-restarts). The attacker's pace (a
# short sleep between changes) is no part of the verdict, which waits for the keys while the
# attacker's loop still runs.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemCleanup;

my $node = cleanup_node('orphan_pass_resume');

# 60,000 live keys of `keeper`, then 300 of `victim`, last in the heap.
$node->safe_psql('app', 'CREATE ROLE keeper; CREATE ROLE victim');
insert_keys($node, q{SELECT 'keeper' AS r, g FROM generate_series(1, 60000) g
                     UNION ALL SELECT 'victim', g FROM generate_series(1, 300) g ORDER BY 1, 2});
is($node->safe_psql('app', q{
    SELECT (SELECT min(ctid) FROM idempotency.idempotency_keys WHERE owner = 'victim') >
           (SELECT max(ctid) FROM idempotency.idempotency_keys WHERE owner = 'keeper')}),
  't', "the victim's keys are at the end of the heap");
ok(more_rounds($node, 2), 'the worker runs rounds');

# The attacker: CREATEROLE, dropping a role of its own until told to stop (at most 100,000
# times: far longer than any run of this test).
my $attacker = start_churn($node, 'LOGIN CREATEROLE', 100000,
  q{EXECUTE format('CREATE ROLE %I', 'churned_' || i)},
  q{EXECUTE format('DROP ROLE %I', 'churned_' || i)});
my $churning = q{SELECT count(*) FROM pg_stat_activity
                  WHERE usename = 'churner' AND state = 'active' AND query LIKE 'CALL churn()%'};
ok($node->poll_query_until('postgres', $churning, '1'), 'the attacker creates and drops roles');

$node->safe_psql('postgres', 'DROP ROLE victim');
my $from = stat_of($node, 'cleanup_runs');
ok($node->poll_query_until('app',
    q{SELECT count(*) = 0 FROM idempotency.idempotency_keys WHERE owner = 'victim'}),
  "the dropped role's keys at the end of the heap are deleted while roles keep being dropped");
diag('rounds it took: ' . (stat_of($node, 'cleanup_runs') - $from));
is($node->safe_psql('app', q{SELECT count(*) FROM idempotency.idempotency_keys WHERE owner = 'keeper'}),
  '60000', 'no key of an existing role went');
is($node->safe_psql('postgres', $churning), '1', 'the attacker was still at it');

stop_churn($node, $attacker);
$node->stop;
done_testing();
