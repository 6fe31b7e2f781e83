# PgBouncer in transaction pooling mode in front of the server: the claim protocol keeps
# no session state, so clients whose transactions share one or two server sessions still
# get exactly-once. (The full exactly-once harness through PgBouncer, with crashes, runs
# in test/suites/chaos.sh.)
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $pgbouncer = `command -v pgbouncer` || (-x '/usr/sbin/pgbouncer' ? '/usr/sbin/pgbouncer' : '');
chomp $pgbouncer;
plan skip_all => 'pgbouncer is not installed (Debian package pgbouncer)' unless $pgbouncer;

my $node = PostgreSQL::Test::Cluster->new('behind_pgbouncer');
$node->init;
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'idempotency'");
$node->start;
$node->safe_psql('postgres', q{
  CREATE DATABASE app;
});
$node->safe_psql('app', q{
  CREATE EXTENSION idempotency;
  CREATE TABLE account (id int PRIMARY KEY, n int NOT NULL);
  INSERT INTO account VALUES (1, 0);
});

my $dir = $node->basedir;
my $port = PostgreSQL::Test::Cluster::get_free_port();
my $sockdir = PostgreSQL::Test::Utils::tempdir_short();
my $ini = "$dir/pgbouncer.ini";
sub start_bouncer {
  my ($pool) = @_;
  open my $fh, '>', "$dir/userlist.txt" or die;
  print $fh "\"$ENV{USER}\" \"\"\n" if $ENV{USER};
  print $fh "\"postgres\" \"\"\n";
  close $fh;
  open $fh, '>', $ini or die;
  print $fh join("\n",
    '[databases]',
    'app = host=' . $node->host . ' port=' . $node->port . ' dbname=app',
    '[pgbouncer]',
    'listen_addr =',
    "listen_port = $port",
    "unix_socket_dir = $sockdir",
    'auth_type = trust',
    "auth_file = $dir/userlist.txt",
    'pool_mode = transaction',
    "default_pool_size = $pool",
    'max_client_conn = 100',
    'ignore_startup_parameters = extra_float_digits,options',
    "logfile = $dir/pgbouncer.log",
    "pidfile = $dir/pgbouncer.pid", '');
  close $fh;
  system($pgbouncer, '-d', $ini) == 0 or die "pgbouncer did not start";
  for (1 .. 100) { last if -S "$sockdir/.s.PGSQL.$port"; select(undef, undef, undef, 0.05); }
}
sub stop_bouncer {
  open my $fh, '<', "$dir/pgbouncer.pid" or return;
  my $pid = <$fh>;
  close $fh;
  chomp $pid;
  kill 'TERM', $pid;
  for (1 .. 100) { last unless kill 0, $pid; select(undef, undef, undef, 0.05); }
}
END { stop_bouncer() if $dir; }

# libpq of 19beta asks for protocol version 3.9999 by default, to test the negotiation
# ("grease"; to be reverted before 19's RC1), and PgBouncer 1.18 (Debian 12) refuses it
# ("bad packet header"). psql and pgbench go through PgBouncer with protocol 3.0, what
# libpq up to 18 asks for anyway (libpq before 18 ignores the variable).
$ENV{PGMAXPROTOCOLVERSION} = '3.0';

my $user = $node->safe_psql('postgres', 'SELECT current_user');
sub via_bouncer {
  my ($sql) = @_;
  my ($out, $err);
  my $ok = IPC::Run::run([ 'psql', '-X', '-A', '-t', '-q', '-v', 'ON_ERROR_STOP=1', '-h', $sockdir, '-p', $port,
    '-U', $user, '-d', 'app', '-c', $sql ], '>', \$out, '2>', \$err);
  chomp $out;
  return ($ok, $out, $err);
}

# One server session shared by every client.
start_bouncer(1);
my ($ok, $out, $err) = via_bouncer(q{SELECT token FROM claim_key('order-1', request_fingerprint('{"a":1}'::jsonb))});
ok($ok && $out =~ /^[0-9a-f-]{36}$/, "client 1 claims and commits (two-phase) through PgBouncer: $out$err");
my $token = $out;
($ok, $out) = via_bouncer(q{SELECT status FROM claim_key('order-1', request_fingerprint('{"a":1}'::jsonb))});
is($out, 'in_progress', 'client 2, on the same server session, sees in_progress');
($ok, $out, $err) = via_bouncer(qq{SELECT checkpoint_key('order-1', '$token', 'charged') IS NOT NULL});
is($out, 't', "client 3 checkpoints with the token $err");
($ok, $out, $err) = via_bouncer(qq{SELECT status FROM complete_key('order-1', '$token', '{"id": 42}', 201)});
is($out, 'replay', "client 4 completes with the token $err");
($ok, $out) = via_bouncer(q{SELECT status || ' ' || (response->>'id') || ' ' || response_code
                              FROM claim_key('order-1', request_fingerprint('{"a": 1}'::jsonb))});
is($out, 'replay 42 201', 'client 5 gets the stored response');
($ok, $out, $err) = via_bouncer(q{BEGIN; SELECT claim_key('rolled-back'); ROLLBACK;});
($ok, $out, $err) = via_bouncer(q{SELECT status FROM claim_key('rolled-back')});
is($out, 'claimed', 'a claim rolled back by one client leaves nothing for the next');
# Client backends only: the cleanup worker's process for this database shows there too
# while it serves its rounds.
($ok, $out) = via_bouncer(q{SELECT count(DISTINCT backend_start) FROM pg_stat_activity
                              WHERE datname = 'app' AND backend_type = 'client backend'});
is($out, '1', 'all of that went through one server session');
stop_bouncer();

# Inbox pattern from 8 pgbench clients over 2 server sessions: 800 transactions over 100
# keys, every key's effect (n + 1) applied exactly once; duplicates wait for the holder.
start_bouncer(2);
my $script = "$dir/inbox.sql";
open my $fh, '>', $script or die;
print $fh <<'SQL';
\set k random(1, 100)
BEGIN;
SELECT status AS st, coalesce(token::text, '') AS tk FROM claim_key('inbox-' || :k, NULL, '', NULL, NULL, '10 s') \gset
UPDATE account SET n = n + 1 WHERE id = 1 AND ':st' IN ('claimed', 'reclaimed');
SELECT complete_key('inbox-' || :k, NULLIF(':tk', '')::uuid, '{"done": true}') WHERE ':st' IN ('claimed', 'reclaimed');
COMMIT;
SQL
close $fh;
my ($pout, $perr);
IPC::Run::run([ 'pgbench', '-n', '-c', '8', '-j', '2', '-t', '100', '-f', $script, '-h', $sockdir, '-p', $port,
  '-U', $user, 'app' ], '>', \$pout, '2>', \$perr);
like($pout, qr{processed: 800/800}, 'pgbench ran 800 inbox transactions through PgBouncer')
  or diag($pout . $perr);
my $claimed = $node->safe_psql('app', q{SELECT count(*) FROM idempotency_keys WHERE key LIKE 'inbox-%' AND status = 'completed'});
is($node->safe_psql('app', 'SELECT n FROM account'), $claimed,
  "the effect was applied once per key ($claimed keys), never for a duplicate");
is($node->safe_psql('app', q{SELECT count(*) FROM idempotency_keys WHERE status = 'processing' AND key LIKE 'inbox-%'}),
  '0', 'no key left processing');
stop_bouncer();

done_testing();
