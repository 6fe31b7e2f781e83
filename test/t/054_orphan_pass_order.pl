# A pass over the keys of dropped roles that a later drop overtakes goes on from the block it
# reached, and comes round to it again, instead of starting over from block 0 (issue #32,
# item 2; the mutant pass-restarts in test/mutants/mutants.txt). And expired keys are deleted
# in every round, also while such a pass is under way (the mutant expired-after-orphans).
#
# Deterministic, step by step: the throttle makes every round of the worker one batch of one
# block. With idempotency.cleanup_cost_limit = 1 and a session of `app` holding a snapshot
# (other sessions at work), a batch may delete one key, and the pause after it is
# idempotency.cleanup_delay (1 s), after which the round's second of work is over: the next
# round goes on. The order in which the keys went is read from the WAL (a logical
# replication slot, test_decoding), not from the moments the test looks, so the verdicts
# depend on nothing but that order:
#   - `first` owns a key in block 1 and one in the last block, `late` one in block 0;
#   - DROP ROLE first starts a pass; once its key in block 1 is gone (the pass is past block
#     0), DROP ROLE late overtakes it, and a key of `keeper` expires;
#   - a pass that goes on deletes first's last key before it comes round to late's in block 0;
#     one that starts over deletes late's first; the expired key goes in the next round, long
#     before the pass ends.
# One precondition is checked, not assumed: the drop of `late` reached the pass while it was
# under way (one pass completed, not two). It holds while the test takes less than the
# table's blocks (about 30) in seconds between two of its statements.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemSession;
use IdemCleanup;

my $node = cleanup_node('orphan_pass_order',
  init => { allows_streaming => 'logical' },
  interval => '100ms',
  conf => q{
idempotency.cleanup_cost_limit = 1
idempotency.cleanup_delay = '1000ms'
});
$node->safe_psql('postgres', 'CREATE ROLE keeper; CREATE ROLE first; CREATE ROLE late');
# The pass of the worker's first round (over an empty table) is done before any key exists.
ok($node->poll_query_until('app',
    q{SELECT orphan_passes >= 1 FROM idempotency.idempotency_stats WHERE datname = 'app'}),
  'the first pass is done');

# 1,500 keys of keeper, then three of them given to first and late: an UPDATE puts the new
# version in the same block (fillfactor 90 leaves room).
insert_keys($node, q{SELECT 'keeper' AS r, g FROM generate_series(1, 1500) g ORDER BY g});
my $last_block = $node->safe_psql('app',
  q{SELECT max((ctid::text::point)[0])::int FROM idempotency.idempotency_keys});
cmp_ok($last_block, '>=', 25, "the table has $last_block + 1 blocks");
my $give = sub {
  my ($role, $block) = @_;
  $node->safe_psql('app', qq{
    UPDATE idempotency.idempotency_keys SET owner = '$role', owner_oid = '$role'::regrole
     WHERE ctid = (SELECT min(ctid) FROM idempotency.idempotency_keys
                    WHERE (ctid::text::point)[0] = $block AND owner = 'keeper')
    RETURNING key});
};
my $late_key = $give->('late', 0);
my $early_key = $give->('first', 1);
my $last_key = $give->('first', $last_block);
my $expiring_key = $node->safe_psql('app', qq{
  SELECT key FROM idempotency.idempotency_keys
   WHERE (ctid::text::point)[0] = $last_block - 2 AND owner = 'keeper' LIMIT 1});
is($node->safe_psql('app', q{
    SELECT string_agg(owner || ':' || (ctid::text::point)[0], ' ' ORDER BY ctid)
      FROM idempotency.idempotency_keys WHERE owner <> 'keeper'}),
  "late:0 first:1 first:$last_block", 'the keys of late and first are where the test needs them');

$node->safe_psql('app',
  q{SELECT pg_create_logical_replication_slot('deletions', 'test_decoding')});
# Other sessions at work, as the throttle sees them: one of `app` holds a snapshot.
my $busy = long_session($node, 'app');
$busy->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1');
my $passes = stat_of($node, 'orphan_passes');

$node->safe_psql('postgres', 'DROP ROLE first');
my $gone = sub {
  my ($key) = @_;
  return "SELECT NOT EXISTS (SELECT FROM idempotency.idempotency_keys WHERE key = '$key')";
};
ok($node->poll_query_until('app', $gone->($early_key)),
  "the pass deletes first's key in block 1: it is past block 0");
$node->safe_psql('postgres', 'DROP ROLE late');
$node->safe_psql('app', qq{
  UPDATE idempotency.idempotency_keys SET expires_at = now() - interval '1 second'
   WHERE key = '$expiring_key'});
ok($node->poll_query_until('app', 'SELECT (' . $gone->($late_key) . ') AND (' . $gone->($last_key) . ')'),
  'the keys of both dropped roles go');
ok($node->poll_query_until('app',
    "SELECT orphan_passes > $passes FROM idempotency.idempotency_stats WHERE datname = 'app'"),
  'and the pass ends');
is(stat_of($node, 'orphan_passes'), $passes + 1,
  'one pass ended: the drop of late reached the pass under way (the precondition)');

# The deletions in the order of their commits.
my @order = map { /key\[text\]:'([^']*)'/ ? ($1) : () } split /\n/, $node->safe_psql('app', q{
  SELECT data FROM pg_logical_slot_get_changes('deletions', NULL, NULL)
   WHERE data LIKE 'table idempotency.idempotency_keys: DELETE:%'});
my %name = ($early_key => 'first@1', $last_key => "first\@$last_block", $late_key => 'late@0',
  $expiring_key => 'expired');
my $order = join(' ', map { $name{$_} // $_ } @order);
diag("deletions in commit order: $order");
is($order, "first\@1 expired first\@$last_block late\@0",
  "after the drop of late the pass goes on to the end before it comes round to block 0, "
    . 'and the expired key goes before the pass ends');

end_session($busy);
$node->stop;
done_testing();
