# Installing, upgrading and dumping as an outside reviewer would attack them (SPEC §7,
# issue #11 "attack it again yourself"):
#   - CREATE EXTENSION into a schema `idempotency` that an untrusted role prepared (owns,
#     may create objects in) or that already holds objects: refused (42501 / 42P06), and
#     nothing is created;
#   - a non-superuser database owner cannot create, update or drop the extension;
#   - pg_dump by a non-superuser database owner: refused on the key table (42501) unless
#     its data is excluded; the key-lock salt is never dumped;
#   - DROP ROLE of a role that owns keys: a dump taken before the cleanup leaves its keys
#     out, a restore brings back only live roles' keys, the cleanup deletes them;
#   - default privileges of the installing superuser must not hand the extension's tables
#     to another role (FINDING 1 of the security review: fails on 7feb2ed).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemSecurity;

my $node = PostgreSQL::Test::Cluster->new('security_install');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.cleanup_interval = '1h'
});
$node->start;

$node->safe_psql('postgres', q{
  CREATE ROLE dbowner LOGIN;
  CREATE ROLE alice LOGIN;
  CREATE ROLE mallory LOGIN;
  CREATE ROLE writers NOLOGIN;
  GRANT writers TO mallory;
  CREATE ROLE ghost LOGIN;
});

# (rc, stdout, stderr) of $sql as $role (the session role), with SQLSTATEs in messages.
sub try_as {
  my ($role, $db, $sql) = @_;
  return $node->psql($db, $sql, extra_params => [ '-U', $role, '-v', 'VERBOSITY=verbose' ]);
}

sub attributes { return role_attributes($node, $_[0]); }
my $plain = $NO_ATTRIBUTES;

# Every object outside the system schemas: a refused CREATE EXTENSION must leave this as it
# was.
my $objects = q{
  SELECT string_agg(x, ', ' ORDER BY x) FROM (
    SELECT 'extension ' || extname FROM pg_extension
    UNION ALL SELECT 'schema ' || nspname FROM pg_namespace
    UNION ALL SELECT 'relation ' || oid::regclass::text FROM pg_class WHERE relnamespace > 16383
    UNION ALL SELECT 'function ' || oid::regprocedure::text FROM pg_proc WHERE pronamespace > 16383
    UNION ALL SELECT 'type ' || oid::regtype::text FROM pg_type WHERE typnamespace > 16383
    UNION ALL SELECT 'operator ' || oid::regoperator::text FROM pg_operator WHERE oprnamespace > 16383) o(x)};

# --- a schema prepared by the database owner --------------------------------------------

$node->safe_psql('postgres', 'CREATE DATABASE prepared OWNER dbowner');
# The owner prepares `idempotency` with traps that log and try ALTER ROLE ... SUPERUSER if
# anything of the install script ever called them.
my ($rc, $out, $err) = try_as('dbowner', 'prepared', q{
  CREATE SCHEMA attacker;
  CREATE TABLE attacker.log (who name, what text);
  GRANT ALL ON attacker.log TO PUBLIC;
  CREATE FUNCTION attacker.pwn(what text) RETURNS void LANGUAGE plpgsql AS $$
  BEGIN
    INSERT INTO attacker.log VALUES (current_user, what);
    BEGIN EXECUTE 'ALTER ROLE dbowner SUPERUSER'; EXCEPTION WHEN OTHERS THEN NULL; END;
  END $$;
  CREATE SCHEMA idempotency;
  GRANT USAGE, CREATE ON SCHEMA idempotency TO PUBLIC;
  CREATE FUNCTION idempotency.gen_random_uuid() RETURNS uuid LANGUAGE plpgsql AS $$
    BEGIN PERFORM attacker.pwn('gen_random_uuid'); RETURN '00000000-0000-0000-0000-000000000000'; END $$;
  CREATE FUNCTION idempotency.replace(text, text, text) RETURNS text LANGUAGE plpgsql AS $$
    BEGIN PERFORM attacker.pwn('replace'); RETURN $1; END $$;
  CREATE FUNCTION idempotency.has_schema_privilege(oid, oid, text) RETURNS boolean LANGUAGE plpgsql AS $$
    BEGIN PERFORM attacker.pwn('has_schema_privilege'); RETURN false; END $$;
});
is($rc, 0, 'the database owner prepares a schema idempotency with traps') or diag($err);
my $before = $node->safe_psql('prepared', $objects);
($rc, $out, $err) = $node->psql('prepared', 'CREATE EXTENSION idempotency', extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/42501: schema idempotency is owned by role dbowner, which is not a superuser/,
  'CREATE EXTENSION by a superuser into the database owner\'s schema fails with 42501');
is($node->safe_psql('prepared', $objects), $before, 'and creates nothing');
is($node->safe_psql('prepared', q{SELECT string_agg(proname, ',' ORDER BY proname) FROM pg_proc
                                   WHERE pronamespace = 'idempotency'::regnamespace}),
  'gen_random_uuid,has_schema_privilege,replace', 'the prepared schema holds only what its owner put there');
is($node->safe_psql('prepared', q{SELECT coalesce(string_agg(who || ': ' || what, '; '), 'none') FROM attacker.log}),
  'none', 'no trap ran');
is(attributes('dbowner'), $plain, 'the database owner gained nothing');

# The database owner cannot create the extension itself (not trusted), anywhere.
$node->safe_psql('postgres', 'CREATE DATABASE owned OWNER dbowner');
$before = $node->safe_psql('owned', $objects);
($rc, $out, $err) = try_as('dbowner', 'owned', 'CREATE EXTENSION idempotency');
like($err, qr/42501: permission denied to create extension "idempotency"/,
  'the database owner cannot CREATE EXTENSION idempotency (42501)');
is($node->safe_psql('owned', $objects), $before, 'nothing was created');
($rc, $out, $err) = try_as('dbowner', 'owned', 'CREATE SCHEMA mine; CREATE EXTENSION idempotency SCHEMA mine');
like($err, qr/42501: permission denied to create extension "idempotency"|0A000: extension "idempotency" must be installed in schema "idempotency"/,
  'nor into a schema of its own');
is($node->safe_psql('owned', $objects), $before =~ s/schema information_schema/schema information_schema, schema mine/r,
  'nothing was created but the owner\'s own schema');
# A superuser cannot put it elsewhere either: the schema is fixed.
($rc, $out, $err) = $node->psql('owned', 'CREATE EXTENSION idempotency SCHEMA public', extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/extension "idempotency" must be installed in schema "idempotency"/,
  'CREATE EXTENSION idempotency SCHEMA public is refused: the schema is fixed');

# --- superuser-owned schemas that others may create in, or that hold objects -----------

my @prepared = (
  [ 'create_mallory', 'GRANT CREATE ON SCHEMA idempotency TO mallory',
    qr/42501: role mallory, which is not a superuser, may create objects in schema idempotency/,
    'a superuser-owned schema where mallory has CREATE' ],
  [ 'create_public', 'GRANT CREATE ON SCHEMA idempotency TO PUBLIC',
    qr/42501: role \w+, which is not a superuser, may create objects in schema idempotency/,
    'a superuser-owned schema where PUBLIC has CREATE' ],
  [ 'create_group', 'GRANT CREATE ON SCHEMA idempotency TO writers',
    qr/42501: role (writers|mallory), which is not a superuser, may create objects in schema idempotency/,
    'a superuser-owned schema where a group of mallory\'s has CREATE' ],
  [ 'holds_function', 'CREATE FUNCTION idempotency.now() RETURNS timestamptz LANGUAGE sql AS $$SELECT pg_catalog.now()$$',
    qr/42P06: schema idempotency already holds objects/, 'a superuser-owned schema that holds a function' ],
  [ 'holds_table', 'CREATE TABLE idempotency.idempotency_keys (key text)',
    qr/42P06: schema idempotency already holds objects/, 'a superuser-owned schema that holds a table' ],
  [ 'holds_type', 'CREATE TYPE idempotency.claim_status AS ENUM (\'claimed\')',
    qr/42P06: schema idempotency already holds objects/, 'a superuser-owned schema that holds a type' ],
  [ 'holds_operator', 'CREATE OPERATOR idempotency.= (LEFTARG = text, RIGHTARG = text, FUNCTION = pg_catalog.texteq)',
    qr/42P06: schema idempotency already holds objects/, 'a superuser-owned schema that holds an operator' ],
);
for my $case (@prepared) {
  my ($db, $setup, $expected, $what) = @$case;
  $node->safe_psql('postgres', "CREATE DATABASE $db");
  $node->safe_psql($db, "CREATE SCHEMA idempotency; $setup");
  my $before = $node->safe_psql($db, $objects);
  my ($rc, $out, $err) = $node->psql($db, 'CREATE EXTENSION idempotency', extra_params => [ '-v', 'VERBOSITY=verbose' ]);
  like($err, $expected, "CREATE EXTENSION into $what is refused");
  is($node->safe_psql($db, $objects), $before, "  and creates nothing ($db)");
}
# Positive control: an empty superuser-owned schema that application roles may use.
$node->safe_psql('postgres', 'CREATE DATABASE prepared_ok');
$node->safe_psql('prepared_ok', 'CREATE SCHEMA idempotency; GRANT USAGE ON SCHEMA idempotency TO alice');
($rc, $out, $err) = $node->psql('prepared_ok', 'CREATE EXTENSION idempotency');
is($rc, 0, 'CREATE EXTENSION into an empty superuser-owned schema works (control)') or diag($err);

# --- upgrade and drop by the database owner ---------------------------------------------

$node->safe_psql('postgres', 'CREATE DATABASE app OWNER dbowner');
$node->safe_psql('app', q{
  CREATE EXTENSION idempotency;
  GRANT USAGE ON SCHEMA idempotency TO alice, ghost, dbowner;
});
for my $cmd ('ALTER EXTENSION idempotency UPDATE', q{ALTER EXTENSION idempotency UPDATE TO '1.0'},
  'DROP EXTENSION idempotency', 'DROP EXTENSION idempotency CASCADE', 'DROP SCHEMA idempotency CASCADE',
  'ALTER EXTENSION idempotency SET SCHEMA public')
{
  my ($rc, $out, $err) = try_as('dbowner', 'app', $cmd);
  like($err, qr/ERROR:  42501: /, "the database owner cannot: $cmd (42501)");
}
is($node->safe_psql('app', q{SELECT extversion || ' in ' || extnamespace::regnamespace FROM pg_extension WHERE extname = 'idempotency'}),
  '1.3 in idempotency', 'the extension is as installed (the default version, 1.3)');

# --- pg_dump by the database owner; DROP ROLE and dumps ---------------------------------

$node->safe_psql('app', q{
  SET ROLE alice;
  SELECT count(*) FROM generate_series(1, 20) g,
    LATERAL idempotency.complete_key('alice-key-' || g, (idempotency.claim_key('alice-key-' || g)).token,
                                     jsonb_build_object('for', 'alice-response-' || g)) c;
  SET ROLE ghost;
  SELECT count(*) FROM generate_series(1, 10) g,
    LATERAL idempotency.complete_key('ghost-key-' || g, (idempotency.claim_key('ghost-key-' || g)).token,
                                     jsonb_build_object('for', 'ghost-response-' || g)) c;
});
my $salt = $node->safe_psql('app', q{SELECT encode(salt, 'hex') FROM idempotency.key_lock_salt});
my $dir = $PostgreSQL::Test::Utils::tmp_check;

my ($stdout, $stderr);
my $dumped = IPC::Run::run([ 'pg_dump', '-d', $node->connstr('app'), '-U', 'dbowner', '-f', "$dir/owner.sql" ],
  '>', \$stdout, '2>', \$stderr);
ok(!$dumped, 'pg_dump by the non-superuser database owner fails');
like($stderr, qr/permission denied for table idempotency_keys/, '  on the key table (42501: permission denied)');
$dumped = IPC::Run::run([ 'pg_dump', '-d', $node->connstr('app'), '-U', 'dbowner',
    '--exclude-table-data=idempotency.idempotency_keys', '-f', "$dir/owner.sql" ], '>', \$stdout, '2>', \$stderr);
ok($dumped, 'with --exclude-table-data=idempotency.idempotency_keys it succeeds') or diag($stderr);
my $owner_dump = slurp_file("$dir/owner.sql");
unlike($owner_dump, qr/alice-response|ghost-response/, '  and holds no response');
like($owner_dump, qr/CREATE EXTENSION IF NOT EXISTS idempotency WITH SCHEMA idempotency/, '  but the extension');
$node->safe_psql('postgres', 'CREATE DATABASE from_owner_dump');
$node->command_ok([ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('from_owner_dump'),
  '-f', "$dir/owner.sql" ], 'that dump restores (as a superuser)');
is($node->safe_psql('from_owner_dump', q{SELECT count(*) FROM idempotency.idempotency_keys}), '0',
  '  into an empty key table');

# DROP ROLE while it owns keys; a superuser's dump before the cleanup leaves them out.
$node->safe_psql('from_owner_dump', 'REVOKE USAGE ON SCHEMA idempotency FROM ghost');
$node->safe_psql('app', 'REVOKE USAGE ON SCHEMA idempotency FROM ghost; DROP ROLE ghost');
is($node->safe_psql('app', q{SELECT count(*) FROM idempotency.idempotency_keys WHERE key LIKE 'ghost-key-%'}), '10',
  'after DROP ROLE the dropped role\'s keys are still in the table (no cleanup yet)');
$node->command_ok([ 'pg_dump', '-d', $node->connstr('app'), '-f', "$dir/super.sql" ], 'pg_dump by a superuser');
$node->command_ok([ 'pg_dump', '-Fc', '-d', $node->connstr('app'), '-f', "$dir/super.dump" ], 'pg_dump -Fc by a superuser');
my $super_dump = slurp_file("$dir/super.sql");
unlike($super_dump, qr/ghost-key|ghost-response/, 'the dump leaves out the keys of the dropped role');
like($super_dump, qr/alice-response-20/, 'but keeps the keys of existing roles');
unlike($super_dump, qr/$salt/, 'the key-lock salt is not in the dump');
$node->safe_psql('postgres', 'CREATE DATABASE restored');
$node->command_ok([ 'pg_restore', '--exit-on-error', '-d', $node->connstr('restored'), "$dir/super.dump" ],
  'pg_restore of the custom dump');
is($node->safe_psql('restored', q{SELECT string_agg(DISTINCT owner::text, ',') || ' ' || count(*) FROM idempotency.idempotency_keys}),
  'alice 20', 'the restore holds alice\'s keys only');
isnt($node->safe_psql('restored', q{SELECT encode(salt, 'hex') FROM idempotency.key_lock_salt}), $salt,
  'the restored installation has a salt of its own');
is($node->safe_psql('app', 'SELECT idempotency.idempotency_cleanup()'), '10',
  'idempotency_cleanup() deletes the dropped role\'s 10 keys');
is($node->safe_psql('app', q{SELECT count(*) FROM idempotency.idempotency_keys}), '20', 'and only those');

# --- FINDING 1: default privileges of the installing superuser --------------------------
# A superuser who once ran ALTER DEFAULT PRIVILEGES FOR ROLE ... GRANT ... ON TABLES TO a
# role (common for reporting or admin roles) hands that role the extension's tables when
# it creates the extension: the script revokes only PUBLIC's rights. With TRIGGER the
# role puts a trigger on idempotency_keys that runs as the extension owner (a superuser)
# on the next claim_key of anyone; with SELECT it reads every role's responses and the
# salt. Correct behaviour: CREATE EXTENSION refuses, or no role but the owner keeps any
# privilege on the extension's tables. Fails on 7feb2ed.
$node->safe_psql('postgres', 'CREATE DATABASE default_acl');
$node->safe_psql('default_acl', q{
  ALTER DEFAULT PRIVILEGES GRANT SELECT, TRIGGER ON TABLES TO mallory;
  CREATE SCHEMA attacker AUTHORIZATION mallory;
});
($rc, $out, $err) = $node->psql('default_acl', 'CREATE EXTENSION idempotency');
my $installed = $node->safe_psql('default_acl', q{SELECT count(*) FROM pg_extension WHERE extname = 'idempotency'});
if ($installed) {
  $node->safe_psql('default_acl', 'GRANT USAGE ON SCHEMA idempotency TO alice, mallory');
  is($node->safe_psql('default_acl', q{
      SELECT coalesce(string_agg(format('%s: %s', c.relname, a.privilege_type), ', ' ORDER BY c.relname, a.privilege_type), 'none')
        FROM pg_class c, LATERAL aclexplode(c.relacl) a
       WHERE c.relnamespace = 'idempotency'::regnamespace AND a.grantee = 'mallory'::regrole}),
    'none', 'FINDING 1 (fails on 7feb2ed): default privileges give mallory no right on the extension\'s tables');
  my ($rc2, $out2, $err2) = try_as('mallory', 'default_acl', q{
    CREATE FUNCTION attacker.pwn() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN EXECUTE 'ALTER ROLE mallory SUPERUSER'; RETURN NULL; END $$;
    CREATE TRIGGER pwn AFTER INSERT ON idempotency.idempotency_keys FOR EACH STATEMENT EXECUTE FUNCTION attacker.pwn();});
  like($err2, qr/42501/, 'FINDING 1 (fails on 7feb2ed): mallory cannot put a trigger on idempotency_keys');
  $node->psql('default_acl', q{SELECT idempotency.claim_key('k')}, extra_params => [ '-U', 'alice' ]);
  is(attributes('mallory'), $plain, 'FINDING 1 (fails on 7feb2ed): alice\'s claim_key does not make mallory a superuser');
  $node->safe_psql('postgres', 'ALTER ROLE mallory NOSUPERUSER');
} else {
  like($err, qr/ERROR/, 'CREATE EXTENSION refuses to install under default privileges for another role');
  pass('(refused: no rights handed out)');
  pass('(refused: no trigger possible)');
}

ok(!$node->log_contains(qr/terminated by signal|was terminated by|server process .* exited with exit code|PANIC/),
  'no process crashed (server log)');
$node->stop;
done_testing();
