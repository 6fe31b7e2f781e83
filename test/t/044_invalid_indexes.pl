# A cancelled REINDEX CONCURRENTLY (which a database owner may run on PostgreSQL 15 and 16)
# leaves invalid copies of the key table's indexes behind (issue #20 item 8). They must not
# push every claim onto the executor path, where a batch takes one lock per key (a
# 20,000-key batch then failed with 53200): claims stay on the direct path, take no per-key
# lock, and give a leftover index that is ready for inserts its entries, as PostgreSQL
# requires (checked with amcheck once the leftover is marked valid).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('invalid_indexes');
$node->init;
$node->append_conf('postgresql.conf', "max_connections = 100\nmax_locks_per_transaction = 64\n");
$node->start;
$node->safe_psql('postgres', q{
  CREATE EXTENSION idempotency;
  CREATE EXTENSION amcheck;
  CREATE ROLE app LOGIN;
  GRANT USAGE ON SCHEMA idempotency TO app;
});
$node->safe_psql('postgres', q{SELECT count(idempotency.claim_key('before-' || g)) FROM generate_series(1, 100) g},
  extra_params => [ '-U', 'app' ]);

# A transaction keeps an old snapshot: REINDEX CONCURRENTLY builds its copies, then waits for
# that snapshot before it validates them, and its statement_timeout cancels it there.
my $holder = $node->background_psql('postgres');
$holder->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1;');
my ($rc, $out, $err) = $node->psql('postgres', q{
  SET statement_timeout = '500ms';
  REINDEX TABLE CONCURRENTLY idempotency.idempotency_keys;
});
like($err, qr/canceling statement due to statement timeout/, 'REINDEX CONCURRENTLY is cancelled');
$holder->query_safe('COMMIT');
$holder->quit;
my $leftovers = $node->safe_psql('postgres', q{
  SELECT string_agg(c.relname || ':' || i.indisready, ',' ORDER BY c.relname)
    FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
   WHERE i.indrelid = 'idempotency.idempotency_keys'::regclass AND NOT i.indisvalid});
like($leftovers, qr/idempotency_keys_pkey_ccnew:t/, "it left an invalid copy of the primary key, ready for inserts ($leftovers)");

# A query's answer in a background session, without the trailing newline that 16.2's
# BackgroundPsql keeps (later releases strip it).
sub answer {
  my ($session, $sql) = @_;
  my $out = $session->query_safe($sql);
  $out =~ s/\s+\z//;
  return $out;
}

# A 20,000-key batch in one transaction: no lock per key, so no 53200.
my $batch = $node->background_psql('postgres', extra_params => [ '-U', 'app' ]);
is(answer($batch, q{BEGIN;
  SELECT count(*) FILTER (WHERE status = 'claimed')
    FROM idempotency.claim_keys(ARRAY(SELECT 'batch-' || g FROM generate_series(1, 20000) g));}),
  '20000', 'a 20,000-key batch claims every key');
is(answer($batch, q{SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory'}),
  '0', 'and holds no per-key lock (the direct path)');
$batch->query_safe('COMMIT');
$batch->quit;
is($node->safe_psql('postgres', q{SELECT status FROM idempotency.claim_key('batch-7')}, extra_params => [ '-U', 'app' ]),
  'in_progress', 'its keys are held after COMMIT (processing, lease running)');

# The leftover copy got an entry for every new row: marked valid, amcheck finds each one.
$node->safe_psql('postgres', q{
  UPDATE pg_index SET indisvalid = true
   WHERE indexrelid = 'idempotency.idempotency_keys_pkey_ccnew'::regclass});
$node->safe_psql('postgres', q{SELECT bt_index_check('idempotency.idempotency_keys_pkey_ccnew', true)});
pass('every row has its entry in the leftover copy of the primary key (bt_index_check heapallindexed)');

$node->stop;
done_testing();
