# The permission and object-access hooks see every access to the key table (issue #21 item
# 7): with a module that sets ExecutorCheckPerms_hook (pgaudit here, sepgsql likewise), the
# direct heap path steps aside and every read and write of a claim goes through the
# executor, so the module's audit log shows them. (1.1 wrote new keys with heap_insert past
# the hook: pgaudit logged nothing.) Where pgaudit is not installed, PostgreSQL's test module
# test_oat_hooks (test/build-postgres.sh installs it), which sets the same hooks, sends the
# claims to the executor for the checks after the audit log's.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemSession;
use Time::HiRes qw(time);

my $pkglib = `pg_config --pkglibdir`;
chomp $pkglib;
my $module = -e "$pkglib/pgaudit.so" ? 'pgaudit' : -e "$pkglib/test_oat_hooks.so" ? 'test_oat_hooks' : '';
plan skip_all => "neither pgaudit (Debian: postgresql-15-pgaudit) nor test_oat_hooks is installed"
  unless $module;

my $node = PostgreSQL::Test::Cluster->new('executor_hooks');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = '$module,idempotency'
});
$node->append_conf('postgresql.conf', q{
pgaudit.log = 'read, write, function'
pgaudit.log_relation = on
}) if $module eq 'pgaudit';
$node->start;
$node->safe_psql('postgres', q{CREATE EXTENSION pgaudit}) if $module eq 'pgaudit';
$node->safe_psql('postgres', q{
  CREATE EXTENSION idempotency;
  CREATE ROLE app LOGIN;
  GRANT USAGE ON SCHEMA idempotency TO app;
});

SKIP: {
  skip 'the audit log is pgaudit\'s', 5 unless $module eq 'pgaudit';
  # pgaudit logs the statements a function runs for a superuser caller (for other roles it
  # logs the top-level statement only): the claims below are a superuser's.
  my $offset = -s $node->logfile;
  my $token = $node->safe_psql('postgres', q{SELECT token FROM idempotency.claim_key('audited-1')});
  $node->safe_psql('postgres', qq{SELECT status FROM idempotency.complete_key('audited-1', '$token', '{}')});
  $node->safe_psql('postgres', q{SELECT status FROM idempotency.claim_key('audited-1')});
  my $log = slurp_file($node->logfile, $offset);

  like($log, qr/AUDIT: SESSION,.*,WRITE,INSERT,TABLE,idempotency\.idempotency_keys/,
    'the insert of a new key is audited (it went through the executor)');
  like($log, qr/AUDIT: SESSION,.*,WRITE,UPDATE,TABLE,idempotency\.idempotency_keys/,
    'its completion is audited');
  like($log, qr/AUDIT: SESSION,.*,READ,SELECT,TABLE,idempotency\.idempotency_keys/,
    'the looks at the key are audited');
  is($node->safe_psql('postgres', q{SELECT status || ' ' || attempts FROM idempotency.idempotency_keys WHERE key = 'audited-1'}),
    'completed 1', 'and the key is stored as on the direct path');
  # The object-access hook sees a call in FROM, which the extension's result scan runs in
  # place of the function scan (src/result_scan.cpp): pgaudit's FUNCTION class logs it.
  like($log, qr/AUDIT: SESSION,.*,FUNCTION,EXECUTE,FUNCTION,idempotency\.claim_key/,
    'a claim in FROM (the result scan) is audited as a function call');
}

# Any role's claim takes the executor path while the hook is set: a new key is first locked
# by the per-key transaction lock, which the direct path never takes.
is($node->safe_psql('postgres', q{
     BEGIN;
     SELECT status FROM idempotency.claim_key('app-1') \g /dev/null
     SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory';
     COMMIT;}, extra_params => [ '-U', 'app' ]),
  '1', "an application role's claim goes through the executor too");

# Snapshot transactions on the executor path (issue #22): a look after waiting reads the key
# as of now too, as the direct look does.
# A REPEATABLE READ waiter whose holder completes the key: that version committed after the
# waiter's snapshot, so the waiter fails with 40001 once the completion wakes it, instead of
# answering from its snapshot's old row (in_progress) when its wait runs out. The waiter waits
# an hour, its safety net an hour off too (idempotency.wait_recheck_interval, set for `app`):
# only the completion's wake-up ends its sleep, and its answer coming at all (within the
# harness's timeout) is the verdict, not a duration.
$node->safe_psql('postgres', q{ALTER ROLE app SET idempotency.wait_recheck_interval = '1h'});
$node->safe_psql('postgres', q{SELECT idempotency.claim_key('rr-wait', lease => '1 hour')},
  extra_params => [ '-U', 'app' ]);
my $holder_token = $node->safe_psql('postgres',
  q{SELECT lease_token FROM idempotency.idempotency_keys WHERE key = 'rr-wait'});
my $waiter = long_session($node, 'postgres', extra_params => [ '-U', 'app' ], on_error_stop => 0);
my $waiter_pid = $waiter->query_safe('SELECT pg_backend_pid()');
$waiter->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ');
$waiter->query_safe('SELECT 1');
$waiter->{stdout} = '';
$waiter->{stderr} = '';
$waiter->query_until(qr/waiting/, q{\echo waiting
  SELECT status FROM idempotency.claim_key('rr-wait', wait => '1 hour');
  \echo done
});
ok($node->poll_query_until('postgres',
    "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $waiter_pid AND wait_event_type = 'Extension')"),
  'REPEATABLE READ waiter: it sleeps on the key');
$node->safe_psql('postgres', qq{SELECT idempotency.complete_key('rr-wait', '$holder_token', '{}')},
  extra_params => [ '-U', 'app' ]);
ok(pump_until($waiter->{run}, $waiter->{timeout}, \$waiter->{stdout}, qr/done/),
  'REPEATABLE READ waiter: the completion wakes it (its wait and its safety net are an hour off)');
like($waiter->{stderr}, qr/could not serialize access due to concurrent update/,
  'REPEATABLE READ waiter: 40001 once the holder completes (not in_progress from its snapshot)');
end_session($waiter);
$node->safe_psql('postgres', q{ALTER ROLE app RESET idempotency.wait_recheck_interval});

# This transaction's own writes are no serialization conflict: the read as of now sees them
# as the look it is compared with does. A key repeated in one REPEATABLE READ batch: the
# later occurrence meets the batch's own claim (a version newer than the statement's
# snapshot, made by an earlier command of this transaction): in_progress, as on the direct
# path.
my ($rc, $batch, $batch_error) = $node->psql('postgres', q{
  BEGIN ISOLATION LEVEL REPEATABLE READ;
  SELECT string_agg(status::text, ',' ORDER BY ordinality)
    FROM idempotency.claim_keys(ARRAY['rr-b1', 'rr-b2', 'rr-b1']);
  ROLLBACK;}, extra_params => [ '-U', 'app' ]);
is($batch . $batch_error, 'claimed,claimed,in_progress',
  'REPEATABLE READ batch with a repeated key: the own claim is no conflict');
# A claim that waits on this transaction's own earlier claim looks again after its wait (a
# look as of now): in_progress, not 40001.
my ($rc_own, $own, $own_error) = $node->psql('postgres', q{
  BEGIN ISOLATION LEVEL REPEATABLE READ;
  SELECT status FROM idempotency.claim_key('rr-own', lease => '1 hour');
  SELECT status FROM idempotency.claim_key('rr-own', wait => '200 ms');
  ROLLBACK;}, extra_params => [ '-U', 'app' ]);
is($own . $own_error, "claimed\nin_progress",
  'REPEATABLE READ claim waiting on its own transaction\'s claim: no conflict');


$node->stop;
done_testing();
