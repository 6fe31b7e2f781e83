# No role can stall the cleanup (issue #32, item 2). A role with LOGIN alone, connected to
# `postgres`, sets its own password again and again (each time a pg_authid change that every
# process learns of) while the worker cleans a table of 300,000 keys in another database: the
# keys that expire meanwhile are gone within two rounds, and the password changes start no
# pass over the keys of dropped roles. Then a DROP ROLE does start one, which deletes the
# dropped role's keys. The verdicts count the worker's rounds in idempotency_stats; the
# attacker's pace (a short sleep between changes) is no part of any verdict.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('cleanup_churn');
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
# Waits for `n` more complete rounds of the worker in `app`.
sub more_rounds {
  my ($n) = @_;
  my $runs = stat_of('cleanup_runs');
  return $node->poll_query_until('app',
    "SELECT cleanup_runs >= $runs + $n FROM idempotency.idempotency_stats WHERE datname = 'app'");
}

# 300,000 live keys of 30 roles, stamped as claims would stamp them.
$node->safe_psql('app', q{
  DO $$ BEGIN
    FOR i IN 1 .. 30 LOOP EXECUTE format('CREATE ROLE %I', 'owner' || i); END LOOP;
  END $$;
  INSERT INTO idempotency.idempotency_keys
      (owner, scope, key, attempts, ttl, lease, created_at, expires_at, updated_at, status,
       owner_oid, owner_system)
    SELECT 'owner' || (g % 30 + 1), '', 'k' || g, 1, '1 day', '1 min', now(), now() + interval '1 day',
           now(), 'completed', ('owner' || (g % 30 + 1))::regrole,
           (SELECT system_identifier FROM pg_control_system())
      FROM generate_series(1, 300000) g;
});
ok(more_rounds(2), 'the worker runs rounds');
my $passes = stat_of('orphan_passes');

# The attacker: LOGIN and nothing else, in `postgres`, changing its password until told to
# stop (at most 3,000 times).
$node->safe_psql('postgres', q{
  CREATE ROLE churner LOGIN;
  CREATE TABLE churn_stop (stop boolean);
  INSERT INTO churn_stop VALUES (false);
  GRANT SELECT ON churn_stop TO churner;
  CREATE PROCEDURE churn() LANGUAGE plpgsql AS $$
  BEGIN
    FOR i IN 1 .. 3000 LOOP
      EXIT WHEN (SELECT stop FROM churn_stop);
      EXECUTE format('ALTER ROLE CURRENT_USER PASSWORD %L', 'secret' || i);
      COMMIT;
      PERFORM pg_sleep(0.02);
    END LOOP;
  END $$;
});
my $attacker = $node->background_psql('postgres', on_error_stop => 1, extra_params => [ '-U', 'churner' ]);
$attacker->query_until(qr/churning/, "\\echo churning\nCALL churn();\n");
my $password = sub {
  $node->safe_psql('postgres', q{SELECT rolpassword FROM pg_authid WHERE rolname = 'churner'});
};
my $before = $password->();
ok($node->poll_query_until('postgres',
    "SELECT rolpassword IS DISTINCT FROM '$before' FROM pg_authid WHERE rolname = 'churner'"),
  'the attacker changes its password');

# 2,000 keys expire now; within two rounds they are gone.
is($node->safe_psql('app', q{
  WITH expired AS (UPDATE idempotency.idempotency_keys SET expires_at = now() - interval '1 second'
                    WHERE key IN (SELECT 'k' || g FROM generate_series(1, 300000, 150) g) RETURNING 1)
  SELECT count(*) FROM expired}), '2000', '2,000 keys expire');
my $changing = $password->();
ok(more_rounds(2), 'two more rounds under the attack');
is($node->safe_psql('app', q{SELECT count(*) FROM idempotency.idempotency_keys WHERE expires_at <= now()}),
  '0', 'the expired keys are gone within two rounds, whatever the attacker does');
isnt($password->(), $changing, 'the attacker was changing its password all along');
ok(more_rounds(3), 'more rounds under the attack');
is(stat_of('orphan_passes'), $passes, 'password changes start no pass over the keys of dropped roles');
is($node->safe_psql('app', 'SELECT count(*) FROM idempotency.idempotency_keys'), '298000',
  'and no live key went');

# A DROP ROLE under the same attack: the pass it starts ends, and the role's keys go.
$node->safe_psql('postgres', 'DROP ROLE owner7');
ok($node->poll_query_until('app',
    "SELECT orphan_passes > $passes FROM idempotency.idempotency_stats WHERE datname = 'app'"),
  'a DROP ROLE starts a pass, which ends under the attack');
is($node->safe_psql('app', q{SELECT count(*) FROM idempotency.idempotency_keys WHERE owner = 'owner7'}),
  '0', "the dropped role's keys are deleted");

$node->safe_psql('postgres', 'UPDATE churn_stop SET stop = true');
$attacker->quit;
$node->stop;
done_testing();
