# The cleanup worker cannot be turned against the server (SPEC §7, issue #11 attack 2).
#
# 1. A non-superuser database owner renames public, plants look-alike idempotency_keys
#    tables (with triggers that try ALTER ROLE ... SUPERUSER and log who fired them) in
#    every schema it controls, and keeps swapping schemas while the worker deletes a
#    large backlog of expired keys that unprivileged roles created (and the keys of a
#    dropped role). The backlog goes, the look-alikes stay untouched, no trigger fires,
#    the owner gains nothing, and no process crashes.
# 2. What a worker batch runs as: the extension owner, not the bootstrap superuser the
#    worker connects as (pg_stat_statements records the user of each of its statements).
#    A superuser's probe trigger on the real table showed this before 1.2; since then the
#    worker refuses a table with code on it (it would run as the owner), deletes nothing,
#    and the trigger never runs.
# 3. The extension owner stops being a superuser: the worker refuses the installation
#    (42501 in the log and idempotency_stats), deletes nothing, and the trigger that role
#    may now put on the table never runs.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemSecurity;

my $node = PostgreSQL::Test::Cluster->new('security_worker');
$node->init;
# Small batches with a pause: the backlog takes several seconds (and many rounds, each a
# new worker process with new plans), during which the schemas keep changing.
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency, pg_stat_statements'
pg_stat_statements.track = all
idempotency.cleanup_interval = '200ms'
idempotency.cleanup_batch_size = 500
idempotency.cleanup_delay = '20ms'
});
$node->start;

# SQL as a role that logs in (the session role itself, not SET ROLE).
sub psql_as {
  my ($role, $db, $sql) = @_;
  return $node->safe_psql($db, $sql, extra_params => [ '-U', $role ]);
}

sub attributes { return role_attributes($node, $_[0]); }
my $plain = $NO_ATTRIBUTES;

sub stat_of {
  my ($db, $column) = @_;
  return $node->safe_psql($db,
    "SELECT $column FROM idempotency.idempotency_stats WHERE datname = current_database()");
}

$node->safe_psql('postgres', q{
  CREATE ROLE dbowner LOGIN;
  CREATE ROLE alice LOGIN;
  CREATE ROLE bob LOGIN;
  CREATE ROLE ghost LOGIN;
  CREATE DATABASE app OWNER dbowner;
});
$node->safe_psql('app', q{
  CREATE EXTENSION idempotency;
  GRANT USAGE ON SCHEMA idempotency TO dbowner, alice, bob, ghost;
});

# --- 1. the database owner's look-alikes -----------------------------------------------

psql_as('dbowner', 'app', q{
  SET client_min_messages = warning;
  CREATE SCHEMA attacker;
  CREATE TABLE attacker.log (who name, what text);
  GRANT ALL ON attacker.log TO PUBLIC;
  CREATE TABLE attacker.swaps (n int);
  CREATE FUNCTION attacker.pwn() RETURNS trigger LANGUAGE plpgsql AS $$
  BEGIN
    INSERT INTO attacker.log VALUES (current_user,
      format('%s.%s %s %s %s', TG_TABLE_SCHEMA, TG_TABLE_NAME, TG_WHEN, TG_OP, TG_LEVEL));
    BEGIN
      EXECUTE 'ALTER ROLE dbowner SUPERUSER';
    EXCEPTION WHEN OTHERS THEN NULL;
    END;
    IF TG_LEVEL = 'ROW' THEN RETURN coalesce(NEW, OLD); END IF;
    RETURN NULL;
  END $$;
  -- A look-alike with 2000 expired rows for a misdirected cleanup to delete.
  CREATE FUNCTION attacker.plant(target text) RETURNS void LANGUAGE plpgsql AS $$
  BEGIN
    EXECUTE format('CREATE TABLE %I.idempotency_keys (owner regrole NOT NULL, scope text COLLATE "C" NOT NULL DEFAULT '''','
                   ' key text COLLATE "C" NOT NULL, fingerprint bytea, attempts int NOT NULL DEFAULT 1, ttl interval,'
                   ' lease interval, created_at timestamptz, expires_at timestamptz, lease_token uuid,'
                   ' locked_until timestamptz, recovery_point text, status text, response_code int,'
                   ' updated_at timestamptz, response jsonb, PRIMARY KEY (owner, scope, key))', target);
    EXECUTE format('CREATE INDEX ON %I.idempotency_keys (expires_at)', target);
    EXECUTE format('INSERT INTO %I.idempotency_keys SELECT ''alice'', '''', ''a'' || g, NULL, 1, ''1 ms'', ''1 ms'','
                   ' now(), now() - ''1 day''::interval, NULL, NULL, NULL, ''processing'', NULL, now(), NULL'
                   ' FROM generate_series(1, 2000) g', target);
    EXECUTE format('CREATE TRIGGER pwn_statement BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON %I.idempotency_keys'
                   ' FOR EACH STATEMENT EXECUTE FUNCTION attacker.pwn()', target);
    EXECUTE format('CREATE TRIGGER pwn_row BEFORE INSERT OR UPDATE OR DELETE ON %I.idempotency_keys'
                   ' FOR EACH ROW EXECUTE FUNCTION attacker.pwn()', target);
    EXECUTE format('GRANT ALL ON %I.idempotency_keys TO PUBLIC', target);
    EXECUTE format('CREATE TABLE %I.key_lock_salt AS SELECT ''\x00000000000000000000000000000000''::bytea AS salt', target);
  END $$;
  ALTER SCHEMA public RENAME TO public_saved;
  CREATE SCHEMA public;
  CREATE SCHEMA dbowner;
  CREATE SCHEMA attacker_b;
  SELECT attacker.plant(s) FROM unnest(ARRAY['public', 'dbowner', 'attacker', 'attacker_b']) s;
  -- Control: the triggers fire (here for the owner itself, whom ALTER ROLE refuses).
  DELETE FROM public.idempotency_keys WHERE false;
});
is(psql_as('dbowner', 'app', q{SELECT string_agg(who || ': ' || what, '; ') FROM attacker.log}),
  'dbowner: public.idempotency_keys BEFORE DELETE STATEMENT',
  'control: a look-alike trigger fires and logs');
psql_as('dbowner', 'app', q{DELETE FROM attacker.log});

for my $attempt (
  [ 'ALTER SCHEMA idempotency RENAME TO idempotency_old', qr/must be owner of schema idempotency/ ],
  [ 'ALTER TABLE idempotency.idempotency_keys RENAME TO keys_old', qr/must be owner of table idempotency_keys/ ],
  [ 'CREATE TABLE idempotency.idempotency_keys_2 (a int)', qr/permission denied for schema idempotency/ ],
  [ 'CREATE TRIGGER pwn BEFORE DELETE ON idempotency.idempotency_keys FOR EACH STATEMENT EXECUTE FUNCTION attacker.pwn()',
    qr/must be owner of relation idempotency_keys|permission denied for table idempotency_keys/ ])
{
  my ($rc, $out, $err) = $node->psql('app', $attempt->[0], extra_params => [ '-U', 'dbowner' ]);
  like($err, $attempt->[1], "the database owner cannot: $attempt->[0]");
}

# The swapper: for 10 s, public and attacker_b trade names, a fresh look-alike replaces the
# old one now and then, and the extension's schema and table are tried too (refused).
# Every change commits, so that the worker sees the invalidations between its batches.
my $swapper = $node->background_psql('app', extra_params => [ '-U', 'dbowner' ]);
$swapper->query_safe('SET client_min_messages = warning');
$swapper->query_until(qr/swapping/, q{\echo swapping
DO $$
DECLARE
  deadline timestamptz := clock_timestamp() + interval '10 seconds';
  i int := 0;
BEGIN
  WHILE clock_timestamp() < deadline LOOP
    i := i + 1;
    EXECUTE 'ALTER SCHEMA public RENAME TO swap_tmp';
    EXECUTE 'ALTER SCHEMA attacker_b RENAME TO public';
    EXECUTE 'ALTER SCHEMA swap_tmp RENAME TO attacker_b';
    BEGIN
      EXECUTE 'ALTER SCHEMA idempotency RENAME TO idempotency_old';
    EXCEPTION WHEN insufficient_privilege THEN NULL;
    END;
    BEGIN
      EXECUTE 'ALTER TABLE idempotency.idempotency_keys RENAME TO keys_old';
    EXCEPTION WHEN insufficient_privilege THEN NULL;
    END;
    IF i % 25 = 0 THEN
      EXECUTE 'DROP TABLE attacker_b.idempotency_keys, attacker_b.key_lock_salt';
      PERFORM attacker.plant('attacker_b');
    END IF;
    COMMIT;
    PERFORM pg_sleep(0.02);
  END LOOP;
  INSERT INTO attacker.swaps VALUES (i);
END $$;
});
my $runs_before = stat_of('app', 'cleanup_runs') || 0;
my $deleted_before = stat_of('app', 'expired_deleted') || 0;

# The backlog, made by unprivileged roles while the swaps go on: open claims that expire
# at once (ttl and lease of 1 ms), completed ones (ttl 1 ms from completion), and a dropped
# role's keys.
psql_as('ghost', 'app', q{
  SELECT count(*) FROM generate_series(1, 3000) g, LATERAL idempotency.claim_key('g' || g, NULL, 'ghost', '1 day', '1 hour') c});
$node->safe_psql('app', q{REVOKE USAGE ON SCHEMA idempotency FROM ghost; DROP ROLE ghost;});
for my $round (1 .. 4) {
  psql_as('alice', 'app', qq{
    SELECT count(*) FROM generate_series(1, 6000) g,
      LATERAL idempotency.claim_key('r$round-' || g, NULL, '', '1 millisecond', '1 millisecond') c
     WHERE c.status = 'claimed'});
  psql_as('bob', 'app', qq{
    SELECT count(*) FROM generate_series(1, 2500) g,
      LATERAL idempotency.complete_key('r$round-' || g,
        (idempotency.claim_key('r$round-' || g, NULL, '', '1 millisecond', '1 hour')).token, '{"done": true}') c});
  psql_as('dbowner', 'app', qq{
    SELECT count(*) FROM generate_series(1, 1000) g,
      LATERAL idempotency.claim_key('r$round-' || g, NULL, 'owner', '1 millisecond', '1 millisecond') c});
  $node->safe_psql('app', 'SELECT pg_sleep(1)');
}
psql_as('alice', 'app', q{
  SELECT count(*) FROM generate_series(1, 100) g, LATERAL idempotency.claim_key('live-' || g, NULL, '', '1 day', '1 hour') c});

# Wait for the swapper (its DO ends after 10 s).
$swapper->query_safe('SELECT 1');
$swapper->quit;
my $swaps = psql_as('dbowner', 'app', 'SELECT n FROM attacker.swaps');
cmp_ok($swaps, '>', 50, "the database owner swapped schemas $swaps times");
cmp_ok(stat_of('app', 'cleanup_runs'), '>=', $runs_before + 5, 'the worker ran rounds while the schemas changed');
cmp_ok(stat_of('app', 'expired_deleted'), '>', $deleted_before, 'and deleted keys during the swaps');

ok($node->poll_query_until('app', q{
    SELECT count(*) = 0 FROM idempotency.idempotency_keys
     WHERE expires_at <= now() OR NOT EXISTS (SELECT FROM pg_roles r WHERE r.rolname = owner)}),
  'the whole backlog of expired keys and the dropped role\'s keys is deleted');
is($node->safe_psql('app', q{SELECT count(*) FROM idempotency.idempotency_keys WHERE key LIKE 'live-%'}),
  '100', 'live keys are kept');
cmp_ok(stat_of('app', 'expired_deleted'), '>=', 4 * (6000 + 2500 + 1000) + 3000,
  'idempotency_stats counts every deleted key');
is(stat_of('app', q{coalesce(last_error, 'none')}), 'none', 'no cleanup round failed');
is(psql_as('dbowner', 'app', q{SELECT coalesce(string_agg(who || ': ' || what, '; '), 'none') FROM attacker.log}),
  'none', 'no look-alike trigger ever fired');
is(psql_as('dbowner', 'app', q{
    SELECT string_agg(n::text, ' ') FROM (
      SELECT count(*) AS n FROM public.idempotency_keys
      UNION ALL SELECT count(*) FROM attacker_b.idempotency_keys
      UNION ALL SELECT count(*) FROM dbowner.idempotency_keys
      UNION ALL SELECT count(*) FROM attacker.idempotency_keys) c}),
  '2000 2000 2000 2000', 'every look-alike still holds its expired rows');
is(attributes('dbowner'), $plain, 'the database owner gained no attribute');
ok(!$node->log_contains(qr/terminated by signal|was terminated by|server process .* exited with exit code|PANIC/),
  'no process crashed (server log)');
ok(!$node->log_contains(qr/idempotency cleanup (of database \d+ )?failed/),
  'no cleanup round failed (server log)');

# --- 2. what a batch runs as ------------------------------------------------------------

$node->safe_psql('postgres', q{
  CREATE ROLE extowner SUPERUSER LOGIN;
  CREATE DATABASE probed;
});
psql_as('extowner', 'probed', q{
  CREATE EXTENSION idempotency;
  GRANT USAGE ON SCHEMA idempotency TO alice;
});
$node->safe_psql('probed', 'CREATE EXTENSION pg_stat_statements');
psql_as('alice', 'probed', q{
  SELECT count(*) FROM generate_series(1, 100) g,
    LATERAL idempotency.claim_key('p' || g, NULL, '', '1 millisecond', '1 millisecond') c});
ok($node->poll_query_until('probed', q{SELECT count(*) = 0 FROM idempotency.idempotency_keys}),
  'probe: the worker deletes the expired keys');
is($node->safe_psql('probed', q{
    SELECT string_agg(DISTINCT r.rolname, ', ') FROM pg_stat_statements s JOIN pg_roles r ON r.oid = s.userid
     WHERE s.dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
       AND s.query LIKE '%DELETE FROM%idempotency_keys%'}),
  'extowner',
  'probe: the worker (connected as the bootstrap superuser) deletes as the extension owner (pg_stat_statements)');

# The probe trigger of 1.1 (the bootstrap superuser's, trusted, with a function that names its
# table unqualified): now the worker refuses the table, and the trigger never runs.
psql_as('alice', 'probed', q{
  SELECT count(*) FROM generate_series(1, 20) g,
    LATERAL idempotency.claim_key('q' || g, NULL, '', '1 hour', '1 hour') c});
$node->safe_psql('probed', q{
  CREATE TABLE probe (who name);
  GRANT ALL ON probe TO PUBLIC;
  CREATE FUNCTION probe() RETURNS trigger LANGUAGE plpgsql AS $$
  BEGIN INSERT INTO probe VALUES (current_user); RETURN NULL; END $$;
  CREATE TRIGGER probe AFTER DELETE ON idempotency.idempotency_keys
    FOR EACH STATEMENT EXECUTE FUNCTION probe();
  UPDATE idempotency.idempotency_keys SET expires_at = now() - interval '1 minute', locked_until = NULL;
});
ok($node->poll_query_until('probed', q{
    SELECT last_error LIKE '%table idempotency_keys of extension idempotency has trigger "probe"%'
      FROM idempotency.idempotency_stats WHERE datname = current_database()}),
  'probe trigger: the worker refuses the table (idempotency_stats.last_error names the trigger)');
is($node->safe_psql('probed', q{SELECT count(*) FROM idempotency.idempotency_keys}), '20',
  'probe trigger: nothing was deleted');
is($node->safe_psql('probed', q{SELECT count(*) FROM probe}), '0', 'probe trigger: it never ran');
$node->safe_psql('probed', q{DROP TRIGGER probe ON idempotency.idempotency_keys});
ok($node->poll_query_until('probed', q{SELECT count(*) = 0 FROM idempotency.idempotency_keys}),
  'probe trigger: dropped, the keys are deleted');

# --- 3. an extension owner that is no longer a superuser --------------------------------

$node->safe_psql('postgres', q{
  CREATE ROLE demoted SUPERUSER LOGIN;
  CREATE DATABASE fallen;
});
psql_as('demoted', 'fallen', q{
  CREATE EXTENSION idempotency;
  GRANT USAGE ON SCHEMA idempotency TO alice;
});
psql_as('alice', 'fallen', q{
  SELECT count(*) FROM generate_series(1, 200) g,
    LATERAL idempotency.claim_key('f' || g, NULL, '', '1 day', '1 hour') c});
my $fallen_oid = $node->safe_psql('postgres', q{SELECT oid FROM pg_database WHERE datname = 'fallen'});
$node->safe_psql('postgres', q{ALTER ROLE demoted NOSUPERUSER});
# Then the keys expire (a superuser's shortcut): only the worker's check now stands between
# them and the trigger below.
$node->safe_psql('fallen', q{
  UPDATE idempotency.idempotency_keys SET expires_at = now() - interval '1 minute', locked_until = NULL});
# Now an ordinary role that owns the extension's schema and table: the extension's event
# trigger refuses its DDL there; it owns that event trigger too (it created the extension),
# disables it, and plants a trigger (and its log).
my ($guard_rc, $guard_out, $guard_err) = $node->psql('fallen', 'CREATE TABLE idempotency.log (who name, what text)',
  extra_params => [ '-U', 'demoted', '-v', 'VERBOSITY=verbose' ]);
like($guard_err, qr/42501: only superusers may create or change objects in schema "idempotency"/,
  'demoted owner: the event trigger refuses its CREATE TABLE in the extension\'s schema (42501)');
psql_as('demoted', 'fallen', q{
  ALTER EVENT TRIGGER idempotency_guard_schema DISABLE;
  CREATE TABLE idempotency.log (who name, what text);
  GRANT ALL ON idempotency.log TO PUBLIC;
  CREATE FUNCTION idempotency.pwn() RETURNS trigger LANGUAGE plpgsql AS $$
  BEGIN
    INSERT INTO idempotency.log VALUES (current_user, TG_OP);
    BEGIN
      EXECUTE 'ALTER ROLE demoted SUPERUSER';
    EXCEPTION WHEN OTHERS THEN NULL;
    END;
    RETURN NULL;
  END $$;
  CREATE TRIGGER pwn BEFORE INSERT OR UPDATE OR DELETE ON idempotency.idempotency_keys
    FOR EACH STATEMENT EXECUTE FUNCTION idempotency.pwn();
});
ok($node->poll_query_until('fallen', q{
    SELECT last_error LIKE '%which is not a superuser%' FROM idempotency.idempotency_stats
     WHERE datname = current_database()}),
  'demoted owner: the worker refuses the installation (idempotency_stats.last_error)');
# (The refusal is one of our own errors, which the worker logs without the database OID.)
ok($node->wait_for_log(qr/idempotency cleanup (of database $fallen_oid )?failed: .*owned by role "demoted", which is not a superuser/),
  'demoted owner: the refusal is in the server log');
is($node->safe_psql('fallen', q{SELECT count(*) FROM idempotency.idempotency_keys}), '200',
  'demoted owner: nothing was deleted');
my ($rc, $out, $err) = $node->psql('fallen', q{SELECT status FROM idempotency.claim_key('f-new')},
  extra_params => [ '-U', 'alice', '-v', 'VERBOSITY=verbose' ]);
like($err, qr/42501: schema "idempotency" of extension idempotency is owned by role "demoted", which is not a superuser/,
  'demoted owner: claim_key refuses too (42501)');
is($node->safe_psql('fallen', q{SELECT coalesce(string_agg(who || ' ' || what, '; '), 'none') FROM idempotency.log}),
  'none', 'demoted owner: its trigger never ran');
is(attributes('demoted'), $plain, 'demoted owner: it did not become a superuser again');
ok(!$node->log_contains(qr/terminated by signal|was terminated by|server process .* exited with exit code|PANIC/),
  'no process crashed (server log)');

$node->stop;
done_testing();
