# Background psql sessions for TAP tests that keep them open for long (test/run.sh puts test/t
# on PERL5LIB). PostgreSQL's BackgroundPsql times a session as a whole by default: one that
# lives longer than the harness's timeout dies at its next query or at quit on a loaded
# machine, whatever it was doing. These time each query instead.
package IdemSession;
use strict;
use warnings;
use Exporter 'import';
our @EXPORT = qw(long_session end_session);

# $node->background_psql($db, %params), with the harness's timeout per query.
sub long_session {
  my ($node, $db, %params) = @_;
  my $session = $node->background_psql($db, %params);
  $session->set_query_timer_restart();
  return $session;
}

# Quits a session: its timer starts again first, so that only the quit itself is timed.
sub end_session {
  my ($session) = @_;
  $session->{timeout}->start();
  return $session->quit;
}

1;
