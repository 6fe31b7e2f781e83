# What the TAP tests of the cleanup's rounds and orphan passes share (test/run.sh puts test/t
# on PERL5LIB): a server whose worker cleans a database `app`, its statistics, keys stamped as
# claims stamp them, and a role that changes roles in a loop (the attacker of issue #32).
package IdemCleanup;
use strict;
use warnings;
use Exporter 'import';
use PostgreSQL::Test::Cluster;
use IdemSession;
our @EXPORT = qw(cleanup_node stat_of more_rounds insert_keys start_churn stop_churn);

# A started server with the library preloaded, the worker's rounds every `interval` and
# `extra` lines of configuration, and a database `app` with the extension.
sub cleanup_node {
  my ($name, %options) = @_;
  my $node = PostgreSQL::Test::Cluster->new($name);
  $node->init(%{ $options{init} // {} });
  my $interval = $options{interval} // '200ms';
  $node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempotency'
idempotency.cleanup_interval = '$interval'
} . ($options{conf} // ''));
  $node->start;
  $node->safe_psql('postgres', 'CREATE DATABASE app');
  $node->safe_psql('app', 'CREATE EXTENSION idempotency');
  return $node;
}

# A column of app's row of idempotency_stats (0 before its first round).
sub stat_of {
  my ($node, $column) = @_;
  return $node->safe_psql('app',
    "SELECT coalesce(max($column), 0) FROM idempotency.idempotency_stats WHERE datname = 'app'");
}

# Waits for `n` more complete rounds of the worker in `app`; false if they never come.
sub more_rounds {
  my ($node, $n) = @_;
  my $runs = stat_of($node, 'cleanup_runs');
  return $node->poll_query_until('app',
    "SELECT cleanup_runs >= $runs + $n FROM idempotency.idempotency_stats WHERE datname = 'app'");
}

# Inserts completed keys that live a day, stamped as a claim of their owner stamps them
# (owner_oid, owner_system), in the order of `rows`: SQL with the columns r (the owner, an
# existing role) and g (the key is 'k' || g).
sub insert_keys {
  my ($node, $rows) = @_;
  $node->safe_psql('app', qq{
    INSERT INTO idempotency.idempotency_keys
        (owner, scope, key, attempts, ttl, lease, created_at, expires_at, updated_at, status,
         owner_oid, owner_system)
      SELECT r, '', 'k' || g, 1, '1 day', '1 min', now(), now() + interval '1 day', now(),
             'completed', r::regrole, (SELECT system_identifier FROM pg_control_system())
        FROM ($rows) k});
}

# Starts the attacker: a role `churner` with `attributes` (LOGIN and more), connected to
# `postgres`, running `body` (PL/pgSQL statements of iteration i, each followed by a COMMIT)
# up to `times` times, a short pause between, until stop_churn(). Returns once the loop runs.
sub start_churn {
  my ($node, $attributes, $times, @body) = @_;
  my $statements = join("\n", map { "      $_;\n      COMMIT;" } @body);
  $node->safe_psql('postgres', qq{
    CREATE ROLE churner $attributes;
    CREATE TABLE churn_stop (stop boolean);
    INSERT INTO churn_stop VALUES (false);
    GRANT SELECT ON churn_stop TO churner;
    CREATE PROCEDURE churn() LANGUAGE plpgsql AS \$\$
    BEGIN
      FOR i IN 1 .. $times LOOP
        EXIT WHEN (SELECT stop FROM churn_stop);
$statements
        PERFORM pg_sleep(0.02);
      END LOOP;
    END \$\$;
  });
  my $attacker =
    long_session($node, 'postgres', on_error_stop => 1, extra_params => [ '-U', 'churner' ]);
  $attacker->query_until(qr/churning/, "\\echo churning\nCALL churn();\n");
  return $attacker;
}

# Ends the attacker's loop and its session.
sub stop_churn {
  my ($node, $attacker) = @_;
  $node->safe_psql('postgres', 'UPDATE churn_stop SET stop = true');
  end_session($attacker);
}

1;
