# Settings that decide other roles' keys are a superuser's (issue #20 item 9, SPEC §7).
# idempotency.default_ttl and idempotency.default_lease decide how long every role's keys
# live when its handler passes no ttl or lease: a database owner's ALTER DATABASE ... SET
# idempotency.default_ttl = '1s' made alice's handler run a request twice, 2 s apart. They
# are PGC_SUSET: the database owner's ALTER DATABASE ... SET and a role's own SET are refused
# (42501), with the library preloaded or not (a placeholder is refused too); a superuser's
# ALTER ROLE ... SET is taken by that role's next session, and GRANT SET ON PARAMETER hands
# one setting to one role. The same for the superuser's idempotency.executor_path.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemSecurity;

my %nodes;
for my $preload (1, 0) {
  my $node = PostgreSQL::Test::Cluster->new($preload ? 'settings_preload' : 'settings_plain');
  $node->init;
  $node->append_conf('postgresql.conf', $preload ? "shared_preload_libraries = 'idempotency'\n" : '');
  $node->start;
  $node->safe_psql('postgres', q{
    CREATE ROLE dbowner LOGIN;
    CREATE ROLE alice LOGIN;
    CREATE DATABASE shop OWNER dbowner;
  });
  $node->safe_psql('shop', 'CREATE EXTENSION idempotency; GRANT USAGE ON SCHEMA idempotency TO alice, dbowner');
  $nodes{$preload} = $node;
}

# (stderr) of $sql as $role in database shop, with SQLSTATEs in messages.
sub error_of {
  my ($node, $role, $sql) = @_;
  my ($rc, $out, $err) = $node->psql('shop', $sql, extra_params => [ '-U', $role, '-v', 'VERBOSITY=verbose' ]);
  return $err;
}

for my $preload (1, 0) {
  my $node = $nodes{$preload};
  my $how = $preload ? 'preloaded' : 'not preloaded';
  for my $setting ('default_ttl', 'default_lease', 'executor_path') {
    my $value = $setting eq 'executor_path' ? 'on' : q{'1s'};
    like(error_of($node, 'dbowner', "ALTER DATABASE shop SET idempotency.$setting = $value"),
      qr/42501: permission denied to set parameter "idempotency\.$setting"/,
      "$how: the database owner's ALTER DATABASE shop SET idempotency.$setting is refused (42501)");
    like(error_of($node, 'alice', "ALTER ROLE alice SET idempotency.$setting = $value"),
      qr/42501: permission denied to set parameter "idempotency\.$setting"/,
      "$how: alice's own ALTER ROLE alice SET idempotency.$setting is refused (42501)");
  }
  is($node->safe_psql('shop', q{SELECT count(*) FROM pg_db_role_setting}), '0', "$how: nothing was stored");
  # alice's handler, claiming with the defaults, keeps them: 24 hours, a 5 minute lease.
  is($node->safe_psql('shop', q{
      SELECT extract(epoch FROM c.expires_at - c.created_at)::int FROM idempotency.claim_key('order-1') c},
      extra_params => [ '-U', 'alice' ]), '86400', "$how: alice's key lives 24 hours");
  is($node->safe_psql('shop', q{
      SELECT extract(epoch FROM locked_until - created_at)::int FROM idempotency.idempotency_keys WHERE key = 'order-1'}),
    '300', "$how: with a 5 minute lease");
  is(role_attributes($node, 'dbowner'), $NO_ATTRIBUTES, "$how: the database owner gained nothing");
}

# A superuser sets alice's defaults: her next session has them.
my $node = $nodes{1};
$node->safe_psql('postgres', q{
  ALTER ROLE alice SET idempotency.default_ttl = '2h';
  ALTER ROLE alice SET idempotency.default_lease = '10min';
});
is($node->safe_psql('shop', q{
    SELECT extract(epoch FROM c.expires_at - c.created_at)::int FROM idempotency.claim_key('order-2') c},
    extra_params => [ '-U', 'alice' ]), '7200', 'a superuser\'s ALTER ROLE alice SET idempotency.default_ttl applies to her');
is($node->safe_psql('shop', q{
    SELECT extract(epoch FROM locked_until - created_at)::int FROM idempotency.idempotency_keys WHERE key = 'order-2'}),
  '600', 'and idempotency.default_lease');
is($node->safe_psql('shop', q{
    SELECT extract(epoch FROM c.expires_at - c.created_at)::int FROM idempotency.claim_key('order-3') c},
    extra_params => [ '-U', 'dbowner' ]), '86400', 'other roles keep the defaults');
# A superuser may hand one setting to one role.
$node->safe_psql('postgres', 'GRANT SET ON PARAMETER idempotency.default_ttl TO alice');
is($node->safe_psql('shop', q{
    SET idempotency.default_ttl = '3h';
    SELECT extract(epoch FROM c.expires_at - c.created_at)::int FROM idempotency.claim_key('order-4') c},
    extra_params => [ '-U', 'alice' ]), '10800', 'GRANT SET ON PARAMETER idempotency.default_ttl TO alice lets her set it');
like(error_of($node, 'alice', q{SET idempotency.default_lease = '1s'}),
  qr/42501: permission denied to set parameter "idempotency\.default_lease"/, 'and only that one');

for my $n (values %nodes) {
  ok(!$n->log_contains(qr/terminated by signal|was terminated by|server process .* exited with exit code|PANIC/),
    'no process crashed (server log of ' . $n->name . ')');
  $n->stop;
}
done_testing();
