# The cleanup launcher skips a database that an interrupted DROP DATABASE left half-dropped
# (pg_database.datconnlimit = -2 since PostgreSQL 15.4 and 16: its files may be gone, and no
# one may connect to it). Without the check it would start a worker for it every round, each
# failing to connect with a FATAL. The half-dropped state is made the way DROP DATABASE
# leaves it (datconnlimit = -2, committed), and the verdict waits for rounds of another
# database, which the launcher plans in the same pass over pg_database: no sleeps.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('half_dropped');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.cleanup_interval = '100ms'
});
$node->start;

my $has_marker = $node->safe_psql('postgres', q{SELECT current_setting('server_version_num')::int >= 150004});
plan skip_all => 'half-dropped databases exist from PostgreSQL 15.4 on' unless $has_marker eq 't';

$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');
$node->safe_psql('postgres', 'CREATE DATABASE hd');
$node->safe_psql('hd', 'CREATE EXTENSION idempotency');

sub runs_of {
  my ($db) = @_;
  return $node->safe_psql('postgres',
    "SELECT coalesce(max(cleanup_runs), 0) FROM idempotency.idempotency_stats WHERE datname = '$db'");
}

# Control: while it is whole, the launcher serves hd.
ok($node->poll_query_until('postgres',
    q{SELECT coalesce(max(cleanup_runs), 0) >= 1 FROM idempotency.idempotency_stats WHERE datname = 'hd'}),
  'a whole database gets cleanup rounds');

# Half-dropped, as DROP DATABASE leaves it when interrupted after its first step. A worker
# that the launcher registered for hd before this may still be starting: two rounds of the
# other database first (the launcher plans both in one pass, and the postmaster starts
# workers in the order they were registered), then the window that is looked at.
$node->safe_psql('postgres', q{UPDATE pg_database SET datconnlimit = -2 WHERE datname = 'hd'});
sub more_rounds {
  my ($n) = @_;
  my $runs = runs_of('postgres');
  return $node->poll_query_until('postgres',
    "SELECT cleanup_runs >= $runs + $n FROM idempotency.idempotency_stats WHERE datname = 'postgres'");
}
more_rounds(2);
my $log_start = -s $node->logfile;
my $hd_runs = runs_of('hd');
ok(more_rounds(3), 'the other database keeps getting rounds');
my $log = slurp_file($node->logfile, $log_start);
unlike($log, qr/invalid database "hd"/, 'no worker tried to connect to the half-dropped database');
is(runs_of('hd'), $hd_runs, 'and it got no round');

# DROP DATABASE finishes the job; nothing stands in its way.
$node->safe_psql('postgres', 'DROP DATABASE hd');
is($node->safe_psql('postgres', q{SELECT count(*) FROM pg_database WHERE datname = 'hd'}), '0',
  'DROP DATABASE removes it');

$node->stop;
done_testing();
