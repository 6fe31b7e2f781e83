# What the security TAP tests share (test/run.sh puts test/t on PERL5LIB).
package IdemSecurity;
use strict;
use warnings;
use Exporter 'import';
our @EXPORT = qw(role_attributes $NO_ATTRIBUTES);

# The attributes that would make a role more than an application role, as one line.
sub role_attributes {
  my ($node, $role) = @_;
  return $node->safe_psql('postgres', qq{
    SELECT format('super=%s createrole=%s createdb=%s replication=%s bypassrls=%s',
                  rolsuper, rolcreaterole, rolcreatedb, rolreplication, rolbypassrls)
      FROM pg_roles WHERE rolname = '$role'});
}

# What role_attributes says of a role that has none of them.
our $NO_ATTRIBUTES = 'super=f createrole=f createdb=f replication=f bypassrls=f';

1;
