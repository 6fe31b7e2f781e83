# A backend names the caller's role once and keeps the name (src/caller.cpp, name_of) until a
# change of any role makes it look again: after ALTER ROLE ... RENAME committed in another
# session, a session that claimed keys under the old name stores and finds keys under the new
# one (the owner column holds names: SPEC section 7). Its keys under the old name are no longer
# its own (the cleanup deletes them as keys of a role that no longer exists).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('role_rename');
$node->init;
$node->append_conf('postgresql.conf', qq{shared_preload_libraries = 'idempotency'
idempotency.cleanup_interval = '1h'});
$node->start;
$node->safe_psql('postgres', q{
  CREATE EXTENSION idempotency;
  CREATE ROLE alice;
  GRANT USAGE ON SCHEMA idempotency TO alice;
});

sub owners {
  return $node->safe_psql('postgres',
    q{SELECT string_agg(key || ' ' || owner, ', ' ORDER BY key, owner) FROM idempotency.idempotency_keys});
}

# A pooled connection of the application, acting as alice.
my $app = $node->background_psql('postgres');
$app->query_safe('SET ROLE alice');
# The session's answer to one statement, without the newline that BackgroundPsql keeps on
# some minor releases (16.2's; 15.20's removes it).
sub app_says {
  my $out = $app->query_safe(shift);
  chomp $out;
  return $out;
}
is(app_says(q{SELECT status FROM idempotency.claim_key('before', lease => '1 hour')}), 'claimed',
  'alice claims a key');
is(owners(), 'before alice', 'stored under alice');

# Renamed by an administrator in another session, while the application's backend lives on.
$node->safe_psql('postgres', 'ALTER ROLE alice RENAME TO bob');
is(app_says('SELECT current_user'), 'bob', 'the application session now acts as bob');
is(app_says(q{SELECT status FROM idempotency.claim_key('after', lease => '1 hour')}), 'claimed',
  'a new key after the rename is claimed');
is(app_says(q{SELECT status FROM idempotency.claim_key('before', lease => '1 hour')}), 'claimed',
  "the key claimed under the old name is not the renamed role's: claimed again, not in_progress");
is(owners(), 'after bob, before alice, before bob', 'the keys after the rename are stored under bob');

# Renamed back: the session follows again.
$node->safe_psql('postgres', 'ALTER ROLE bob RENAME TO alice');
is(app_says(q{SELECT status FROM idempotency.claim_key('before', lease => '1 hour')}), 'in_progress',
  "renamed back: the key held under alice is alice's again (in_progress)");
is(app_says(q{SELECT status FROM idempotency.claim_key('back')}), 'claimed', 'and a new key is claimed');
is(owners(), 'after bob, back alice, before alice, before bob', 'stored under alice again');

$app->quit;
$node->stop;
done_testing();
