-- Benchmark schema: the extension plus equivalent tables for the competitors.
-- Run by bench/run.sh as the superuser postgres on its throw-away server.
-- psql variables: nkeys (preloaded completed / processing keys per table).

CREATE EXTENSION idempotency;

-- The floor and the hand-written PL/pgSQL alternative use tables with the same columns,
-- defaults, primary key, expires_at index and fillfactor as idempotency_keys.
CREATE TABLE floor_keys (LIKE idempotency_keys INCLUDING ALL) WITH (fillfactor = 90);
CREATE TABLE pl_keys (LIKE idempotency_keys INCLUDING ALL) WITH (fillfactor = 90);

-- The fingerprint every benchmark request carries (SHA-256 of a small payload) and a
-- different one for the mismatch benchmark.
CREATE FUNCTION bench_fp() RETURNS bytea IMMUTABLE LANGUAGE sql
  AS $$ SELECT request_fingerprint('{"amount": 100, "currency": "EUR"}'::jsonb) $$;

-- Preloaded keys: 'c<n>' completed (replay, mismatch, primary-key SELECT) and 'p<n>'
-- processing with a live lease (in_progress), stored as claim + complete store them.
INSERT INTO idempotency_keys (scope, key, owner, fingerprint, attempts, ttl, lease, created_at,
                              expires_at, lease_token, locked_until, status, response_code,
                              updated_at, response)
SELECT '', 'c' || n, 'postgres', bench_fp(), 1, interval '24 hours', interval '5 minutes', now(),
       now() + interval '24 hours', gen_uuid_v7(), now() + interval '5 minutes', 'completed'::key_status,
       200, now(), jsonb_build_object('status', 'ok', 'payment_id', n, 'amount', 100)
  FROM generate_series(1, :nkeys) n
UNION ALL
SELECT '', 'p' || n, 'postgres', bench_fp(), 1, interval '24 hours', interval '5 minutes', now(),
       now() + interval '24 hours', gen_uuid_v7(), now() + interval '7 days', 'processing'::key_status,
       NULL, now(), NULL
  FROM generate_series(1, :nkeys) n;
INSERT INTO floor_keys SELECT * FROM idempotency_keys;
INSERT INTO pl_keys SELECT * FROM idempotency_keys;

-- The obvious hand-written alternative, written plainly as a user would: insert on
-- conflict, then read the row FOR UPDATE and apply the same checks as claim_key
-- (expiry, fingerprint, completed, lease), with keys per role as claim_key keeps them.
CREATE FUNCTION pl_claim(p_key text, p_fingerprint bytea DEFAULT NULL, p_scope text DEFAULT '',
                         p_ttl interval DEFAULT '24 hours', p_lease interval DEFAULT '5 minutes',
                         OUT status text, OUT token uuid, OUT response jsonb,
                         OUT response_code integer)
LANGUAGE plpgsql AS $$
DECLARE
  r pl_keys%ROWTYPE;
BEGIN
  token := gen_random_uuid();
  INSERT INTO pl_keys (owner, scope, key, fingerprint, ttl, lease, created_at, expires_at,
                       lease_token, locked_until, updated_at)
  VALUES (current_user, p_scope, p_key, p_fingerprint, p_ttl, p_lease, now(),
          now() + p_ttl, token, now() + p_lease, now())
  ON CONFLICT (owner, scope, key) DO NOTHING;
  IF FOUND THEN
    status := 'claimed';
    RETURN;
  END IF;

  SELECT * INTO r FROM pl_keys
   WHERE owner = current_user AND scope = p_scope AND key = p_key FOR UPDATE;
  IF r.expires_at <= now() THEN
    UPDATE pl_keys SET fingerprint = p_fingerprint, attempts = 1, ttl = p_ttl, lease = p_lease,
                       created_at = now(), expires_at = now() + p_ttl, lease_token = token,
                       locked_until = now() + p_lease, recovery_point = NULL,
                       status = 'processing', response = NULL, response_code = NULL,
                       updated_at = now()
     WHERE owner = current_user AND scope = p_scope AND key = p_key;
    status := 'claimed';
    RETURN;
  END IF;
  IF p_fingerprint IS NOT NULL AND r.fingerprint IS NOT NULL AND r.fingerprint <> p_fingerprint THEN
    status := 'mismatch';
    token := NULL;
    RETURN;
  END IF;
  IF r.status = 'completed' THEN
    status := 'replay';
    token := NULL;
    response := r.response;
    response_code := r.response_code;
    RETURN;
  END IF;
  IF r.lease_token IS NOT NULL AND r.locked_until > now() THEN
    status := 'in_progress';
    token := NULL;
    RETURN;
  END IF;
  UPDATE pl_keys SET attempts = attempts + 1, lease_token = token, ttl = p_ttl, lease = p_lease,
                     locked_until = now() + p_lease, expires_at = now() + p_ttl,
                     updated_at = now()
   WHERE owner = current_user AND scope = p_scope AND key = p_key;
  status := 'reclaimed';
END
$$;

CREATE FUNCTION pl_complete(p_key text, p_token uuid, p_response jsonb,
                            p_response_code integer DEFAULT NULL, p_scope text DEFAULT '')
RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
  UPDATE pl_keys SET status = 'completed', response = p_response,
                     response_code = p_response_code, updated_at = now(),
                     expires_at = now() + ttl
   WHERE owner = current_user AND scope = p_scope AND key = p_key AND lease_token = p_token
     AND status = 'processing';
  IF NOT FOUND THEN
    RAISE EXCEPTION 'token does not hold key %', p_key USING ERRCODE = '55000';
  END IF;
  RETURN 'replay';
END
$$;

VACUUM ANALYZE;
CHECKPOINT;
