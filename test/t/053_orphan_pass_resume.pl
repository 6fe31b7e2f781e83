# A pass over the keys of dropped roles gets through under any churn of roles (issue #32,
# item 2). A role with CREATEROLE creates and drops a role of its own again and again: each
# drop is a change that can orphan keys and makes a pass due. A pass that such a change
# overtakes goes on from the block it reached (and comes round to it again) instead of starting
# over from block 0, so the keys of a role dropped at the start, stored at the end of the heap,
# are reached and deleted while the drops go on. (A liveness check: a pass that restarted from
# block 0 at every change, as before, also got through here when the drops left some rounds
# alone; see test/mutants/mutants.txt, pass-restarts.) The attacker's pace (a short sleep
# between changes) is no part of the verdict, which waits for the keys.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('orphan_pass_resume');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.cleanup_interval = '200ms'
});
$node->start;
$node->safe_psql('postgres', 'CREATE DATABASE app');
$node->safe_psql('app', 'CREATE EXTENSION idempotency');

sub stat_of {
  my ($column) = @_;
  return $node->safe_psql('app',
    "SELECT coalesce(max($column), 0) FROM idempotency.idempotency_stats WHERE datname = 'app'");
}

# 60,000 live keys of `keeper`, then 300 of `victim`, last in the heap.
$node->safe_psql('app', q{
  CREATE ROLE keeper; CREATE ROLE victim;
  INSERT INTO idempotency.idempotency_keys
      (owner, scope, key, attempts, ttl, lease, created_at, expires_at, updated_at, status,
       owner_oid, owner_system)
    SELECT r, '', 'k' || g, 1, '1 day', '1 min', now(), now() + interval '1 day', now(), 'completed',
           r::regrole, (SELECT system_identifier FROM pg_control_system())
      FROM (SELECT g, 'keeper' AS r FROM generate_series(1, 60000) g
            UNION ALL SELECT g, 'victim' FROM generate_series(1, 300) g ORDER BY 2, 1) k;
});
is($node->safe_psql('app', q{
    SELECT (SELECT min(ctid) FROM idempotency.idempotency_keys WHERE owner = 'victim') >
           (SELECT max(ctid) FROM idempotency.idempotency_keys WHERE owner = 'keeper')}),
  't', "the victim's keys are at the end of the heap");
my $runs = stat_of('cleanup_runs');
ok($node->poll_query_until('app',
    "SELECT cleanup_runs >= $runs + 2 FROM idempotency.idempotency_stats WHERE datname = 'app'"),
  'the worker runs rounds');

# The attacker: CREATEROLE, dropping a role of its own until told to stop (at most 5,000 times).
$node->safe_psql('postgres', q{
  CREATE ROLE churner LOGIN CREATEROLE;
  CREATE TABLE churn_stop (stop boolean);
  INSERT INTO churn_stop VALUES (false);
  GRANT SELECT ON churn_stop TO churner;
  CREATE PROCEDURE churn() LANGUAGE plpgsql AS $$
  BEGIN
    FOR i IN 1 .. 5000 LOOP
      EXIT WHEN (SELECT stop FROM churn_stop);
      EXECUTE format('CREATE ROLE %I', 'churned_' || i);
      COMMIT;
      EXECUTE format('DROP ROLE %I', 'churned_' || i);
      COMMIT;
      PERFORM pg_sleep(0.02);
    END LOOP;
  END $$;
});
my $attacker = $node->background_psql('postgres', on_error_stop => 1, extra_params => [ '-U', 'churner' ]);
$attacker->query_until(qr/churning/, "\\echo churning\nCALL churn();\n");
my $churning = q{SELECT count(*) FROM pg_stat_activity
                  WHERE usename = 'churner' AND state = 'active' AND query LIKE 'CALL churn()%'};
ok($node->poll_query_until('postgres', $churning, '1'), 'the attacker creates and drops roles');

$node->safe_psql('postgres', 'DROP ROLE victim');
my $from = stat_of('cleanup_runs');
ok($node->poll_query_until('app',
    q{SELECT count(*) = 0 FROM idempotency.idempotency_keys WHERE owner = 'victim'}),
  "the dropped role's keys at the end of the heap are deleted while roles keep being dropped");
diag('rounds it took: ' . (stat_of('cleanup_runs') - $from));
is($node->safe_psql('app', q{SELECT count(*) FROM idempotency.idempotency_keys WHERE owner = 'keeper'}),
  '60000', 'no key of an existing role went');
is($node->safe_psql('postgres', $churning), '1', 'the attacker was still at it');

$node->safe_psql('postgres', 'UPDATE churn_stop SET stop = true');
$attacker->quit;
$node->stop;
done_testing();
