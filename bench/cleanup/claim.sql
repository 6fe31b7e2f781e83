-- pgbench: claim_key of a new random key (a fresh claim: one insert).
\set k random(1, 2000000000)
SELECT status FROM claim_key('bench-' || :k);
