# gen_uuid_v7() from many concurrent backends: no two values collide (a unique index
# would reject the insert), no two backends share random bits (the per-backend CSPRNG
# pool is never inherited across fork), and each backend's values strictly increase,
# also when the system clock steps backwards.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('uuid_v7');
$node->init;
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'idempotency'\nmax_connections = 40");
$node->start;

$node->safe_psql('postgres', q{
  CREATE EXTENSION idempotency;
  CREATE TABLE ids (n bigserial, backend int NOT NULL, u uuid NOT NULL);
  CREATE UNIQUE INDEX ids_u ON ids (u);
});

# One transaction inserts 500 values, each row numbered in generation order (n), with
# the pid of the backend that made it.
my $insert = q{
  INSERT INTO ids (backend, u) SELECT pg_backend_pid(), gen_uuid_v7() FROM generate_series(1, 500);
};

# 8 clients on 2 threads, each a long-lived backend: 8 x 40 transactions x 500 rows.
$node->pgbench('-n -c 8 -j 2 -t 40', 0, [qr{processed: 320/320}], [qr{^$}],
  'concurrent backends insert 160000 values under a unique index',
  { 'uuid_v7_long_lived' => $insert });

# A new backend for every transaction (-C): 100 forks of the postmaster, each with a
# fresh generator.
$node->pgbench('-n -C -c 4 -j 2 -t 25', 0, [qr{processed: 100/100}], [qr{^$}],
  '100 short-lived backends insert 50000 more values',
  { 'uuid_v7_short_lived' => $insert });

is($node->safe_psql('postgres', 'SELECT count(*), count(DISTINCT u) FROM ids'),
  '210000|210000', 'all 210000 values are distinct');

cmp_ok($node->safe_psql('postgres', 'SELECT count(DISTINCT backend) FROM ids'),
  '>=', 100, 'they came from at least 100 different backends');

# The 62 random bits (everything after the variant nibble's 2 bits, seen as the last 16
# hex digits with the variant bits masked) never repeat across backends: a generator
# state shared after fork would repeat them.
is($node->safe_psql('postgres', q{
  SELECT count(*) FROM (
    SELECT set_bit(set_bit(substring(uuid_send(u) FROM 9 FOR 8), 6, 0), 7, 0) AS r
      FROM ids GROUP BY 1 HAVING count(*) > 1) dup}),
  '0', 'no two values share their random bits');

# Within each backend, the values increase in generation order.
is($node->safe_psql('postgres', q{
  SELECT count(*) FROM (
    SELECT u, lag(u) OVER (PARTITION BY backend ORDER BY n) AS prev FROM ids) t
   WHERE u <= prev}),
  '0', 'each backend\'s values strictly increase');

# Every value carries a time within the run (not the zero time, not the future).
is($node->safe_psql('postgres', q{
  SELECT count(*) FROM ids
   WHERE uuid_v7_time(u) NOT BETWEEN now() - interval '10 minutes' AND clock_timestamp()}),
  '0', 'every value carries the time it was made');

# The server never restarted (no backend crashed while generating).
ok(!$node->log_contains('terminated by signal'), 'no backend crashed');

$node->stop;

# The system clock steps back by 10 s in the middle of a session: the values keep
# increasing. libfaketime (LD_PRELOAD into the server) moves the clock; the offset file is
# re-read on every call, so one SQL session can move it with COPY ... TO.
my $libfaketime = '/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1';
ok(-e $libfaketime, 'libfaketime is installed (Debian package libfaketime)')
  or BAIL_OUT('libfaketime is missing: test/lib.sh installs it');
my $clock = PostgreSQL::Test::Cluster->new('clock');
$clock->init;
$clock->append_conf('postgresql.conf', "shared_preload_libraries = 'idempotency'");
my $offset_file = $clock->basedir . '/faketime_offset';
PostgreSQL::Test::Utils::append_to_file($offset_file, "+0\n");
{
  local $ENV{LD_PRELOAD} = $libfaketime;
  local $ENV{FAKETIME_TIMESTAMP_FILE} = $offset_file;
  local $ENV{FAKETIME_NO_CACHE} = '1';
  local $ENV{FAKETIME_DONT_FAKE_MONOTONIC} = '1';
  $clock->start;
}
my $result = $clock->safe_psql('postgres', qq{
  CREATE EXTENSION idempotency;
  CREATE TEMP TABLE s (n serial, u uuid, clock timestamptz);
  INSERT INTO s (u, clock) SELECT gen_uuid_v7(), clock_timestamp() FROM generate_series(1, 10000);
  COPY (SELECT '-10s') TO '$offset_file';
  INSERT INTO s (u, clock) SELECT gen_uuid_v7(), clock_timestamp() FROM generate_series(1, 10000);
  COPY (SELECT '+0') TO '$offset_file';
  SELECT max(clock) FILTER (WHERE n <= 10000) - min(clock) FILTER (WHERE n > 10000) > interval '9 s',
         (SELECT count(*) FROM (SELECT u, lag(u) OVER (ORDER BY n) AS prev FROM s) t WHERE u <= prev),
         count(DISTINCT u)
    FROM s;
});
my ($stepped_back, $not_increasing, $distinct) = split /\|/, $result;
is($stepped_back, 't', 'the server\'s clock stepped back by 10 s mid-session');
is($not_increasing, '0', 'values made after the clock stepped back still increase');
is($distinct, '20000', 'and none repeats one made before');
$clock->stop;

done_testing();
