# A role created under the name of a dropped role, or renamed to another role's name, gets
# none of the earlier role's keys (issue #32, item 1), with and without the library preloaded
# and with no cleanup in between (idempotency.cleanup_worker = off where a worker could run):
# its first claim of the earlier role's completed key answers `claimed`, never the stored
# response, and of an open claim `claimed`, never in_progress; the earlier role's token
# completes nothing. The pgTAP file test/pgtap/role_reuse.sql covers the single-server cases
# in detail (both paths, the fenced calls, the cleanup); this one the server settings.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

for my $preload (1, 0) {
  my $label = $preload ? 'preloaded' : 'not preloaded';
  my $node = PostgreSQL::Test::Cluster->new($preload ? 'reuse_preload' : 'reuse_no_preload');
  $node->init;
  # Overrides the preloading that the test configuration (TEMP_CONFIG) may add.
  $node->append_conf('postgresql.conf',
    $preload
    ? "shared_preload_libraries = 'idempotency'\nidempotency.cleanup_worker = off\n"
    : "shared_preload_libraries = ''\n");
  $node->start;
  is($node->safe_psql('postgres', 'SHOW shared_preload_libraries'),
    $preload ? 'idempotency' : '', "$label: as configured");
  $node->safe_psql('postgres', q{
    CREATE EXTENSION idempotency;
    CREATE ROLE alice LOGIN; GRANT USAGE ON SCHEMA idempotency TO alice;
    CREATE ROLE bob LOGIN; GRANT USAGE ON SCHEMA idempotency TO bob;
  });
  my $as = sub {
    my ($role, $sql) = @_;
    my ($ret, $out, $err) = $node->psql('postgres', $sql, extra_params => [ '-U', $role ]);
    return $ret == 0 ? $out : "error: $err";
  };
  my $claim = sub {
    my ($role, $key) = @_;
    return $as->($role, "SELECT status || ' ' || coalesce(response::text, '-')"
        . " FROM idempotency.claim_key('$key', NULL::bytea, lease => '1 hour')");
  };
  # alice's keys: one completed, one open.
  my $token = $as->('alice', q{SELECT token FROM idempotency.claim_key('order-1')});
  $as->('alice', qq{SELECT idempotency.complete_key('order-1', '$token', '{"by": "old alice"}', 201)});
  my $open = $as->('alice', q{SELECT token FROM idempotency.claim_key('open-1', lease => '1 hour')});
  is($claim->('alice', 'order-1'), 'replay {"by": "old alice"}', "$label: alice replays her key");

  # Two transactions: DROP ROLE, then CREATE ROLE.
  $node->safe_psql('postgres', 'REVOKE USAGE ON SCHEMA idempotency FROM alice; DROP ROLE alice');
  $node->safe_psql('postgres', 'CREATE ROLE alice LOGIN; GRANT USAGE ON SCHEMA idempotency TO alice');
  is($node->safe_psql('postgres', q{SELECT count(*) FROM idempotency.idempotency_keys WHERE owner = 'alice'}),
    '2', "$label: no cleanup ran: the earlier alice's keys are still there");
  like($as->('alice', qq{SELECT idempotency.complete_key('open-1', '$open', '{"by": "new alice"}', 200)}),
    qr/idempotency key "open-1" does not exist or has expired/, "$label: the new alice cannot complete the earlier alice's claim with its token");
  is($claim->('alice', 'order-1'), 'claimed -', "$label: the new alice's claim is claimed, not a replay");
  is($claim->('alice', 'open-1'), 'claimed -', "$label: nor in_progress on the earlier alice's open claim");

  # One transaction: the earlier role's keys, then DROP and CREATE together.
  $as->('bob', q{SELECT idempotency.complete_key('order-2',
                   (SELECT token FROM idempotency.claim_key('order-2')), '{"by": "old bob"}', 201)});
  $node->safe_psql('postgres', q{
    BEGIN;
    REVOKE USAGE ON SCHEMA idempotency FROM bob; DROP ROLE bob;
    CREATE ROLE bob LOGIN; GRANT USAGE ON SCHEMA idempotency TO bob;
    COMMIT});
  is($claim->('bob', 'order-2'), 'claimed -', "$label: DROP and CREATE in one transaction: claimed");

  # A rename swap.
  $as->('alice', q{SELECT idempotency.complete_key('swap', (SELECT token FROM idempotency.claim_key('swap')), '{"by": "alice"}', 200)});
  $as->('bob', q{SELECT idempotency.complete_key('swap', (SELECT token FROM idempotency.claim_key('swap')), '{"by": "bob"}', 200)});
  $node->safe_psql('postgres', 'ALTER ROLE alice RENAME TO tmp; ALTER ROLE bob RENAME TO alice; ALTER ROLE tmp RENAME TO bob');
  is($claim->('alice', 'swap'), 'claimed -', "$label: after a rename swap, the role now named alice gets no replay of alice's key");
  is($claim->('bob', 'swap'), 'claimed -', "$label: nor the role now named bob of bob's");
  $node->stop;
}

done_testing();
