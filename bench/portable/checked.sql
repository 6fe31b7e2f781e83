-- The hand-written pair of bench/sql/setup.sql (pl_claim / pl_complete) with the argument
-- checks both editions make, written as plainly: the key and scope not NULL (22004), the key
-- not empty (22023), key, scope and fingerprint within the default limits (22001), ttl and
-- lease positive and within the default maxima (22023), a token given (22004), a response
-- within the default size (54000). The limits are constants, as a hand-written claim would
-- have them. Run by bench/portable.sh after setup.sql, in the database of pl_keys.

CREATE FUNCTION pl_claim_checked(p_key text, p_fingerprint bytea DEFAULT NULL, p_scope text DEFAULT '',
                                 p_ttl interval DEFAULT '24 hours', p_lease interval DEFAULT '5 minutes',
                                 OUT status text, OUT token uuid, OUT response jsonb,
                                 OUT response_code integer)
LANGUAGE plpgsql AS $$
DECLARE
  r pl_keys%ROWTYPE;
BEGIN
  IF p_key IS NULL OR p_scope IS NULL THEN
    RAISE EXCEPTION 'key and scope must not be null' USING ERRCODE = '22004';
  END IF;
  IF p_key = '' THEN
    RAISE EXCEPTION 'key must not be empty' USING ERRCODE = '22023';
  END IF;
  IF octet_length(p_key) > 255 OR octet_length(p_scope) > 255 OR octet_length(p_fingerprint) > 64 THEN
    RAISE EXCEPTION 'key, scope or fingerprint is too long' USING ERRCODE = '22001';
  END IF;
  IF p_ttl <= interval '0' OR p_ttl > interval '30 days' OR p_lease <= interval '0' OR p_lease > interval '1 day' THEN
    RAISE EXCEPTION 'ttl or lease out of range' USING ERRCODE = '22023';
  END IF;

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

CREATE FUNCTION pl_complete_checked(p_key text, p_token uuid, p_response jsonb,
                                    p_response_code integer DEFAULT NULL, p_scope text DEFAULT '')
RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
  IF p_key IS NULL OR p_scope IS NULL OR p_token IS NULL THEN
    RAISE EXCEPTION 'key, scope and token must not be null' USING ERRCODE = '22004';
  END IF;
  IF pg_column_size(p_response) > 1048576 THEN
    RAISE EXCEPTION 'response is too large' USING ERRCODE = '54000';
  END IF;
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
