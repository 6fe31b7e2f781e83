# A key answers only the role that claimed it, whatever moved its row (issue #20, item 7):
# COPY in text and in binary format, and logical replication's initial copy and streaming,
# into a cluster where the role names map to other OIDs. In the target cluster the role
# `eve` is given the OID that `alice` has in the source (roles are created in another order),
# so a row that carried an OID instead of a name would answer eve.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my @nodes;
for my $name ('source', 'copy_target', 'subscriber') {
  my $node = PostgreSQL::Test::Cluster->new($name);
  $node->init(allows_streaming => 'logical');
  $node->append_conf('postgresql.conf', qq{shared_preload_libraries = 'idempotency'
idempotency.cleanup_interval = '1h'});
  $node->start;
  push @nodes, $node;
}
my ($source, $target, $subscriber) = @nodes;

# Source: alice first; the targets: eve first, then alice, so that OIDs differ by name.
$source->safe_psql('postgres', q{CREATE ROLE alice LOGIN; CREATE ROLE eve LOGIN;});
for my $node ($target, $subscriber) {
  $node->safe_psql('postgres', q{CREATE ROLE eve LOGIN; CREATE ROLE alice LOGIN;});
}
for my $node (@nodes) {
  $node->safe_psql('postgres', q{CREATE EXTENSION idempotency;
    GRANT USAGE ON SCHEMA idempotency TO alice, eve;});
}
my $alice_oid = $source->safe_psql('postgres', q{SELECT oid FROM pg_roles WHERE rolname = 'alice'});
isnt($alice_oid, $target->safe_psql('postgres', q{SELECT oid FROM pg_roles WHERE rolname = 'alice'}),
  'alice has another OID in the target cluster');

# The subscriber follows the source's key table from the start (initial copy, then changes).
$source->safe_psql('postgres',
  q{CREATE PUBLICATION keys FOR TABLE idempotency.idempotency_keys});
my $source_dsn = $source->connstr . ' dbname=postgres';
$subscriber->safe_psql('postgres',
  qq{CREATE SUBSCRIPTION keys CONNECTION '$source_dsn' PUBLICATION keys});

# alice completes order-1 and holds order-2 in the source.
$source->safe_psql('postgres', q{
  SET ROLE alice;
  SELECT idempotency.complete_key('order-1', token, '{"paid": 1}'::jsonb, 201)
    FROM idempotency.claim_key('order-1', lease => '1 hour'::interval);
  SELECT idempotency.claim_key('order-2', lease => '1 hour'::interval);
});

# COPY out of the source and into the target, as a superuser, in both formats.
my $dir = PostgreSQL::Test::Utils::tempdir;
for my $format ('text', 'binary') {
  $source->safe_psql('postgres',
    "COPY idempotency.idempotency_keys TO '$dir/keys.$format' WITH (FORMAT $format)");
}
$target->safe_psql('postgres', q{CREATE DATABASE binary_copy TEMPLATE template0});
$target->safe_psql('binary_copy', q{CREATE EXTENSION idempotency;
  GRANT USAGE ON SCHEMA idempotency TO alice, eve;});
$target->safe_psql('postgres', "COPY idempotency.idempotency_keys FROM '$dir/keys.text' WITH (FORMAT text)");
$target->safe_psql('binary_copy', "COPY idempotency.idempotency_keys FROM '$dir/keys.binary' WITH (FORMAT binary)");

$subscriber->wait_for_subscription_sync($source, 'keys');

# What alice and eve get for order-1 and order-2 (each claim rolled back).
sub answers {
  my ($node, $db, $role) = @_;
  return $node->safe_psql($db, qq{
    BEGIN;
    SET ROLE $role;
    SELECT string_agg(k || ' ' || c.status::text || coalesce(' ' || c.response::text, ''), ', ' ORDER BY k)
      FROM unnest(ARRAY['order-1', 'order-2']) k, LATERAL idempotency.claim_key(k) c;
    ROLLBACK;});
}
my %where = ('COPY text' => [$target, 'postgres'], 'COPY binary' => [$target, 'binary_copy'],
  'logical replication' => [$subscriber, 'postgres']);
for my $how (sort keys %where) {
  my ($node, $db) = @{ $where{$how} };
  is(answers($node, $db, 'alice'), 'order-1 replay {"paid": 1}, order-2 in_progress',
    "$how: alice's keys answer alice");
  is(answers($node, $db, 'eve'), 'order-1 claimed, order-2 claimed',
    "$how: eve (alice's OID in the source) gets none of them");
}

# A change streamed after the initial copy: alice completes order-2.
my $token = $source->safe_psql('postgres',
  q{SELECT lease_token FROM idempotency.idempotency_keys WHERE key = 'order-2'});
$source->safe_psql('postgres', qq{SET ROLE alice;
  SELECT idempotency.complete_key('order-2', '$token', '{"paid": 2}'::jsonb)});
$source->wait_for_catchup('keys');
is(answers($subscriber, 'postgres', 'alice'), 'order-1 replay {"paid": 1}, order-2 replay {"paid": 2}',
  'logical replication: a completion streamed later replays for alice');
is(answers($subscriber, 'postgres', 'eve'), 'order-1 claimed, order-2 claimed',
  'logical replication: and for nobody else');

$_->stop for @nodes;
done_testing();
