# The wait slots leak nothing a role could aim at (issue #20 item 4, SPEC §7). A waiter
# (claim_key with wait > 0) sleeps on the condition variable of its key's slot, one of 1024,
# and any transaction that wrote a key of that slot wakes it: the waiter looks at its key
# again, which its own pg_stat_xact_all_tables.idx_scan shows (2 looks when nothing woke it,
# 3 or more when something did). That is the oracle of the issue: bob, holding keys of his
# own and waiting on them, learns which of them share a slot with keys that alice is
# claiming, even in another database. He must not be able to aim it: the slot is a keyed
# hash (SipHash-2-4) of the database and the key's identity, under a secret made at every
# server start.
#
# Why a TAP test and not a self-check in C: what must hold is that nothing outside the server
# can know the slot map, so the test measures the map from outside, as bob would, with the
# oracle itself, and compares counts, never times. Bob's 64 probes wait 450 ms each (three
# sleeps: the safety net wakes a waiter every 200 ms), so an undisturbed claim looks at its
# key 4 times; meanwhile alice claims 256 keys over and over (each round rolled back, which
# wakes every slot it wrote, about every 10 ms), so a probe in one of those slots looks tens
# of times. A sleep may also end early, rarely, when the look before it waited on a condition
# variable of its own (a buffer being read): one extra look. "Woken" is 8 looks or more.
# Each probe gives one bit; the 64 bits are a fingerprint of the slot map (about a fifth of
# them set). Then:
#   - measured twice in a row, the fingerprint is the same;
#   - alice's claims of the same keys in another database give another fingerprint: the
#     database is in the hash (without it, the same one);
#   - after a restart, the same claims give another fingerprint: the secret is made anew
#     (without a secret, or with a fixed one, the same one).
# A random fingerprint equals another with probability about 0.68^64 (2e-11).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;

my $probes = 64;
my $sessions = 4;    # waiter sessions, each taking every 4th probe
my $targets = 256;

my $node = PostgreSQL::Test::Cluster->new('wait_slots');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.cleanup_interval = '1h'
max_connections = 30
});
$node->start;

$node->safe_psql('postgres', q{
  CREATE ROLE alice LOGIN;
  CREATE ROLE bob LOGIN;
  CREATE DATABASE dba;
  CREATE DATABASE dbb;
});
for my $db ('dba', 'dbb') {
  $node->safe_psql($db, q{
    CREATE EXTENSION idempotency;
    GRANT USAGE ON SCHEMA idempotency TO alice, bob;
    -- The broadcaster's stop flag and round counter (a sequence: its rounds roll back).
    CREATE TABLE public.stop (x int);
    CREATE SEQUENCE public.rounds;
    GRANT SELECT ON public.stop TO alice;
    GRANT USAGE ON SEQUENCE public.rounds TO alice;
  });
}
# bob's probes: his own keys, claimed with a live lease (committed), so that his claims of
# them with wait => '450 ms' sleep for the whole wait unless their slot is woken.
$node->safe_psql('dbb', qq{
  SET ROLE bob;
  SELECT count(*) FROM idempotency.claim_keys(ARRAY(SELECT 'probe-' || g FROM generate_series(1, $probes) g),
                                              NULL, '', '2 hours', '2 hours');
  RESET ROLE;
  -- How many times each probe's claim looked at its key, as bob sees it: 4 when the wait
  -- ran out undisturbed (the first look, and one after each of three sleeps), more when its
  -- slot was woken.
  CREATE FUNCTION public.looks(keys text[]) RETURNS text LANGUAGE plpgsql AS \$\$
  DECLARE
    k text;
    before bigint;
    after bigint;
    result text := '';
  BEGIN
    FOREACH k IN ARRAY keys LOOP
      SELECT coalesce(idx_scan, 0) INTO before FROM pg_stat_xact_all_tables
       WHERE relid = 'idempotency.idempotency_keys'::regclass;
      PERFORM idempotency.claim_key(k, NULL, '', NULL, NULL, '450 milliseconds');
      SELECT coalesce(idx_scan, 0) INTO after FROM pg_stat_xact_all_tables
       WHERE relid = 'idempotency.idempotency_keys'::regclass;
      result := result || (after - before)::text || ' ';
    END LOOP;
    RETURN result;
  END \$\$;
});

sub psql_command {
  my ($db, $role, $sql) = @_;
  return [ 'psql', '-X', '-A', '-t', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr($db), '-U', $role,
    '-c', $sql ];
}

# The fingerprint of the slot map: bob's probes in dbb, woken (1) or not (0), while alice
# claims and rolls back her 256 target keys in `$db`.
sub fingerprint {
  my ($db) = @_;
  my $start = $node->safe_psql($db, 'SELECT last_value FROM public.rounds');
  my ($out, $err) = ('', '');
  my $broadcaster = IPC::Run::start(psql_command($db, 'alice', qq{
    DO \$\$
    BEGIN
      WHILE NOT EXISTS (SELECT FROM public.stop) LOOP
        PERFORM nextval('public.rounds');
        PERFORM count(*) FROM idempotency.claim_keys(ARRAY(SELECT 't-' || g FROM generate_series(1, $targets) g));
        ROLLBACK;
        PERFORM pg_sleep(0.005);
      END LOOP;
    END \$\$}), '>', \$out, '2>', \$err);
  # The broadcaster is in its loop: rounds are ending (each wakes the slots it wrote).
  $node->poll_query_until($db, "SELECT last_value >= $start + 3 FROM public.rounds")
    or die "the broadcaster does not run: $err";
  my @waiters;
  for my $s (0 .. $sessions - 1) {
    my @mine = grep { ($_ - 1) % $sessions == $s } 1 .. $probes;
    my $array = 'ARRAY[' . join(', ', map { "'probe-$_'" } @mine) . ']';
    my %w = (out => '', err => '', probes => \@mine);
    $w{run} = IPC::Run::start(psql_command('dbb', 'bob', "SELECT public.looks($array)"),
      '>', \$w{out}, '2>', \$w{err});
    push @waiters, \%w;
  }
  my @bits = (0) x $probes;
  my @looks;
  for my $w (@waiters) {
    $w->{run}->finish or die "a waiter failed: $w->{err}";
    my @counts = split ' ', $w->{out};
    die "a waiter answered '$w->{out}'" unless @counts == @{ $w->{probes} };
    for my $i (0 .. $#counts) {
      my $probe = $w->{probes}[$i];
      $bits[ $probe - 1 ] = $counts[$i] >= 8 ? 1 : 0;
      $looks[ $probe - 1 ] = $counts[$i];
    }
  }
  my $rounds = $node->safe_psql($db, 'SELECT last_value FROM public.rounds') - $start;
  $node->safe_psql($db, 'INSERT INTO public.stop VALUES (1)');
  $broadcaster->finish or die "the broadcaster failed: $err";
  $node->safe_psql($db, 'DELETE FROM public.stop');
  # The rounds' rolled-back rows, gone before the next measurement.
  $node->safe_psql($db, 'VACUUM idempotency.idempotency_keys');
  my $fingerprint = join('', @bits);
  diag("fingerprint with alice in $db: $fingerprint ($rounds rounds; looks: @looks)");
  return $fingerprint;
}

my $first = fingerprint('dbb');
my $ones = () = $first =~ /1/g;
ok($ones > 0 && $ones < $probes,
  "control: while alice claims, some of bob's probes are woken ($ones of $probes) and some are not");
is(fingerprint('dbb'), $first, 'the same claims again give the same fingerprint (the measurement is exact)');
isnt(fingerprint('dba'), $first,
  'alice\'s claims of the same keys in another database wake other probes: the database is in the hash');

$node->restart;
my $after = fingerprint('dbb');
my $ones_after = () = $after =~ /1/g;
ok($ones_after > 0, "after a restart the oracle still wakes probes ($ones_after of $probes)");
isnt($after, $first, 'but other ones: the slots are keyed by a secret made at start-up');

ok(!$node->log_contains(qr/terminated by signal|was terminated by|server process .* exited with exit code|PANIC/),
  'no process crashed (server log)');
$node->stop;
done_testing();
