-- claim_key of a completed key with a different fingerprint: mismatch.
\set n random(1, :nkeys)
SELECT status, fingerprint FROM claim_key('c' || :n, request_fingerprint('other'::text));
