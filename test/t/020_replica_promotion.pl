# Streaming replication and failover keep every key: keys written on the primary are on
# the standby, byte for byte; a duplicate on the standby is answered (replay) or refused
# cleanly, never crashes it; after promotion the new primary replays stored responses,
# answers in_progress for a live lease, reclaims an expired one and fences old tokens.
# (The cleanup worker's idleness on a standby is tested in 012_worker_standby.pl.)
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $primary = PostgreSQL::Test::Cluster->new('primary');
$primary->init(allows_streaming => 1);
$primary->append_conf('postgresql.conf', "shared_preload_libraries = 'idempotency'");
$primary->start;
$primary->safe_psql('postgres', 'CREATE EXTENSION idempotency');
$primary->backup('b1');

my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'b1', has_streaming => 1);
$standby->start;

# Completed keys (two-phase: claim and commit, complete later), one per scope, with a
# fingerprint, a response, a code and a recovery point; one multibyte key.
$primary->safe_psql('postgres', q{
  CREATE TABLE tokens (k text PRIMARY KEY, t uuid);
  INSERT INTO tokens
    SELECT 'pay-' || g, (claim_key('pay-' || g, request_fingerprint(jsonb_build_object('n', g)),
                                   CASE WHEN g % 2 = 0 THEN '' ELSE 'tenant-1' END)).token
      FROM generate_series(1, 200) g;
  SELECT checkpoint_key(k, t, 'charged', CASE WHEN substr(k, 5)::int % 2 = 0 THEN '' ELSE 'tenant-1' END)
    FROM tokens;
  SELECT complete_key(k, t, jsonb_build_object('charge', k, 'amount', 100 * substr(k, 5)::int), 201,
                      CASE WHEN substr(k, 5)::int % 2 = 0 THEN '' ELSE 'tenant-1' END)
    FROM tokens;
  SELECT claim_key('café-€-𝄞', NULL, '', NULL, '1 hour');
  -- processing with a live lease, and with a lease that ends at once
  SELECT claim_key('held', NULL, '', NULL, '1 hour');
  INSERT INTO tokens VALUES ('short', (claim_key('short', NULL, '', NULL, '1 second')).token);
});
my $rows = q{SELECT string_agg(t::text, E'\n' ORDER BY scope, key) FROM idempotency_keys t};
$primary->wait_for_catchup($standby, 'replay', $primary->lsn('insert'));

is($standby->safe_psql('postgres', 'SELECT count(*) FROM idempotency_keys'), '203',
  'the standby has every key');
is($standby->safe_psql('postgres', $rows), $primary->safe_psql('postgres', $rows),
  'the standby has every key with identical contents (status, tokens, responses, expiry)');

# On the standby: a duplicate of a completed key is a read (replay), a new key cannot be
# claimed there (read-only), and neither disturbs the standby.
my ($rc, $out, $err) = $standby->psql('postgres',
  q{SELECT status, response->>'amount', response_code FROM claim_key('pay-7', request_fingerprint('{"n": 7}'::jsonb), 'tenant-1')});
# A replay takes no lock and writes nothing (SPEC 3.1), so it works on a hot standby.
is("$rc $out", '0 replay|700|201', 'a duplicate on the standby replays the stored response');
($rc, $out, $err) = $standby->psql('postgres', q{SELECT status FROM claim_key('new-on-standby')});
isnt($rc, 0, 'a new claim on the standby is refused');
like($err, qr/read-only|recovery/, "... with a read-only / recovery error: $err");
is($standby->safe_psql('postgres', 'SELECT 1'), '1', 'the standby still answers');

# Failover.
$primary->stop('immediate');
$standby->promote;
$standby->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()')
  or die 'the standby did not leave recovery';

is($standby->safe_psql('postgres',
    q{SELECT status || ' ' || (response->>'amount') || ' ' || response_code || ' ' || recovery_point
        FROM claim_key('pay-7', request_fingerprint('{"n": 7}'::jsonb), 'tenant-1')}),
  'replay 700 201 charged', 'after promotion a duplicate replays the stored response');
is($standby->safe_psql('postgres', q{
    SELECT count(*) FROM tokens k,
      LATERAL claim_key(k.k, request_fingerprint(jsonb_build_object('n', substr(k.k, 5)::int)),
                        CASE WHEN substr(k.k, 5)::int % 2 = 0 THEN '' ELSE 'tenant-1' END) c
     WHERE k.k LIKE 'pay-%' AND c.status = 'replay'
       AND (c.response->>'amount')::int = 100 * substr(k.k, 5)::int}),
  '200', 'all 200 completed keys replay their own response on the new primary');
is($standby->safe_psql('postgres',
    q{SELECT status FROM claim_key('pay-8', request_fingerprint('{"n": 9}'::jsonb))}),
  'mismatch', 'a different request with a used key is a mismatch on the new primary');
is($standby->safe_psql('postgres', q{SELECT status FROM claim_key('held')}),
  'in_progress', 'a claim whose lease is still running is in_progress after failover');

# The short lease has ended: the key is reclaimed, and the old holder's token is fenced.
$standby->poll_query_until('postgres',
  q{SELECT locked_until < clock_timestamp() FROM idempotency_keys WHERE key = 'short'});
my $reclaim = $standby->safe_psql('postgres',
  q{SELECT status || ' ' || attempts FROM claim_key('short')});
is($reclaim, 'reclaimed 2', 'an expired lease is reclaimed on the new primary');
($rc, $out, $err) = $standby->psql('postgres',
  q{SELECT complete_key('short', (SELECT t FROM tokens WHERE k = 'short'), '{}')});
like($err, qr/token does not hold/, 'the token from before the failover is fenced');
$standby->safe_psql('postgres', q{SELECT claim_key('fresh-after-failover')});
is($standby->safe_psql('postgres', q{SELECT status FROM claim_key('fresh-after-failover')}),
  'in_progress', 'the new primary takes new claims');

$standby->stop;
done_testing();
