-- A hand-written claim that makes the portable edition's checks and keeps its promises, written
-- as plainly as checked.sql (issue #36: "a straightforward hand-written PL/pgSQL claim of the
-- same checks"; the last column of docs/benchmarks.md's "Portable edition" table). Beyond the
-- argument checks of checked.sql, as a careful user would write them from README and SPEC §7:
--   - the limits read from settings (a session may lower them), with the defaults as fallback;
--   - a replay and a mismatch answered from a look at the row, without a lock or a write;
--   - a duplicate of a claim still open answers in_progress at once instead of waiting on the
--     unique index for the claim's transaction: the key's advisory lock is tried first;
--   - that lock's tag keyed by the role's own secret (a table that each role reads only its own
--     row of), so that pg_locks tells no other role which keys are claimed;
--   - keys per role by row-level security (a role reads and writes only rows of its name);
--   - each row stamped with its role's OID and cluster, and a row of the name stamped here by
--     another role (an earlier role of the name) not answered from (issue #32);
--   - bounded values, also in a role's direct writes: a CHECK constraint (the same ceilings as
--     the portable edition's);
--   - times read from the clock at each call (README: "not at transaction start"), so that a
--     completion moves expires_at to the completion time (SPEC section 2). With now(), the
--     transaction's start, a claim and its completion in one transaction write the same
--     expires_at, and the completion is a HOT update, which no edition may do: the benchmarks
--     derive that variant (plt_*) from this file as a second yardstick.
-- Where a plain version has a cheaper choice that keeps the promise, it takes it: a role's
-- secret mixed in by hashtextextended() instead of SHA-256, and the cluster's identifier read
-- once per plan from an IMMUTABLE wrapper, as the portable edition does (read at every call,
-- pg_control_system() costs more than the rest of a claim). It does not check USAGE on a
-- schema at each call, and it answers every call with one body (no separate usual path).
-- Run by bench/portable.sh after setup.sql and checked.sql, in the database of pl_keys, as the
-- superuser.

CREATE TABLE plp_keys (LIKE pl_keys INCLUDING ALL) WITH (fillfactor = 90);
ALTER TABLE plp_keys ADD CONSTRAINT plp_keys_bounded CHECK (
  octet_length(key) BETWEEN 1 AND 1024 AND octet_length(scope) <= 1024
  AND (fingerprint IS NULL OR octet_length(fingerprint) <= 1024)
  AND (recovery_point IS NULL OR octet_length(recovery_point) <= 1048576)
  AND coalesce(pg_column_size(response), 0) <= 536870911 AND attempts >= 1);
INSERT INTO plp_keys SELECT * FROM pl_keys;
ALTER TABLE plp_keys ENABLE ROW LEVEL SECURITY;
CREATE POLICY own_keys ON plp_keys USING (owner = current_user) WITH CHECK (owner = current_user);

CREATE TABLE plp_secrets (
  owner text PRIMARY KEY DEFAULT current_user,
  secret bytea NOT NULL DEFAULT decode(md5(gen_random_uuid()::text) || md5(gen_random_uuid()::text), 'hex'));
ALTER TABLE plp_secrets ENABLE ROW LEVEL SECURITY;
CREATE POLICY own_secret ON plp_secrets USING (owner = current_user) WITH CHECK (owner = current_user);

CREATE FUNCTION plp_system_identifier() RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$ SELECT system_identifier FROM pg_control_system() $$;

CREATE FUNCTION plp_setting(name text, fallback bigint) RETURNS bigint
LANGUAGE sql STABLE AS $$ SELECT coalesce(nullif(current_setting(name, true), '')::bigint, fallback) $$;

CREATE FUNCTION plp_claim(p_key text, p_fingerprint bytea DEFAULT NULL, p_scope text DEFAULT '',
                          p_ttl interval DEFAULT '24 hours', p_lease interval DEFAULT '5 minutes',
                          OUT status text, OUT token uuid, OUT response jsonb,
                          OUT response_code integer)
LANGUAGE plpgsql AS $$
DECLARE
  r plp_keys%ROWTYPE;
  me_oid oid := quote_ident(current_user)::regrole::oid;
  my_secret bytea;
  now_ts timestamptz := clock_timestamp();
BEGIN
  IF p_key IS NULL OR p_scope IS NULL THEN
    RAISE EXCEPTION 'key and scope must not be null' USING ERRCODE = '22004';
  END IF;
  IF p_key = '' THEN
    RAISE EXCEPTION 'key must not be empty' USING ERRCODE = '22023';
  END IF;
  IF octet_length(p_key) > plp_setting('plp.max_key_length', 255)
     OR octet_length(p_scope) > plp_setting('plp.max_key_length', 255)
     OR octet_length(p_fingerprint) > plp_setting('plp.max_fingerprint_size', 64) THEN
    RAISE EXCEPTION 'key, scope or fingerprint is too long' USING ERRCODE = '22001';
  END IF;
  IF p_ttl <= interval '0' OR p_ttl > plp_setting('plp.max_ttl', 2592000) * interval '1 second'
     OR p_lease <= interval '0' OR p_lease > plp_setting('plp.max_lease', 86400) * interval '1 second' THEN
    RAISE EXCEPTION 'ttl or lease out of range' USING ERRCODE = '22023';
  END IF;

  -- A live row of this role answers a replay or a mismatch without a lock or a write.
  SELECT * INTO r FROM plp_keys WHERE owner = current_user AND scope = p_scope AND key = p_key;
  IF FOUND AND r.expires_at > now_ts
     AND (r.owner_oid IS NULL OR r.owner_oid = me_oid OR r.owner_system <> plp_system_identifier()) THEN
    IF p_fingerprint IS NOT NULL AND r.fingerprint IS NOT NULL AND r.fingerprint <> p_fingerprint THEN
      status := 'mismatch';
      RETURN;
    END IF;
    IF r.status = 'completed' THEN
      status := 'replay';
      response := r.response;
      response_code := r.response_code;
      RETURN;
    END IF;
  END IF;

  -- A claim in a transaction still open holds the key's lock: answer at once.
  SELECT secret INTO my_secret FROM plp_secrets WHERE owner = current_user;
  IF NOT FOUND THEN
    INSERT INTO plp_secrets DEFAULT VALUES ON CONFLICT DO NOTHING;
    SELECT secret INTO STRICT my_secret FROM plp_secrets WHERE owner = current_user;
  END IF;
  IF NOT pg_try_advisory_xact_lock(
      hashtextextended(encode(my_secret, 'hex') || '/' || p_scope || '/' || p_key, 0)) THEN
    status := 'in_progress';
    RETURN;
  END IF;
  token := gen_random_uuid();
  INSERT INTO plp_keys (owner, scope, key, fingerprint, ttl, lease, created_at, expires_at,
                        lease_token, locked_until, updated_at, owner_oid, owner_system)
  VALUES (current_user, p_scope, p_key, p_fingerprint, p_ttl, p_lease, now_ts,
          now_ts + p_ttl, token, now_ts + p_lease, now_ts, me_oid, plp_system_identifier())
  ON CONFLICT (owner, scope, key) DO NOTHING;
  IF FOUND THEN
    status := 'claimed';
    RETURN;
  END IF;

  SELECT * INTO r FROM plp_keys
   WHERE owner = current_user AND scope = p_scope AND key = p_key FOR UPDATE;
  IF r.expires_at <= now_ts OR (r.owner_oid <> me_oid AND r.owner_system = plp_system_identifier()) THEN
    UPDATE plp_keys SET fingerprint = p_fingerprint, attempts = 1, ttl = p_ttl, lease = p_lease,
                        created_at = now_ts, expires_at = now_ts + p_ttl, lease_token = token,
                        locked_until = now_ts + p_lease, recovery_point = NULL,
                        status = 'processing', response = NULL, response_code = NULL,
                        updated_at = now_ts, owner_oid = me_oid, owner_system = plp_system_identifier()
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
  IF r.lease_token IS NOT NULL AND r.locked_until > now_ts THEN
    status := 'in_progress';
    token := NULL;
    RETURN;
  END IF;
  UPDATE plp_keys SET attempts = attempts + 1, lease_token = token, ttl = p_ttl, lease = p_lease,
                      locked_until = now_ts + p_lease, expires_at = now_ts + p_ttl,
                      updated_at = now_ts, owner_oid = me_oid, owner_system = plp_system_identifier()
   WHERE owner = current_user AND scope = p_scope AND key = p_key;
  status := 'reclaimed';
END
$$;

CREATE FUNCTION plp_complete(p_key text, p_token uuid, p_response jsonb,
                             p_response_code integer DEFAULT NULL, p_scope text DEFAULT '')
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
  me_oid oid := quote_ident(current_user)::regrole::oid;
  now_ts timestamptz := clock_timestamp();
BEGIN
  IF p_key IS NULL OR p_scope IS NULL OR p_token IS NULL THEN
    RAISE EXCEPTION 'key, scope and token must not be null' USING ERRCODE = '22004';
  END IF;
  IF pg_column_size(p_response) > plp_setting('plp.max_response_size', 1048576) THEN
    RAISE EXCEPTION 'response is too large' USING ERRCODE = '54000';
  END IF;
  UPDATE plp_keys SET status = 'completed', response = p_response,
                      response_code = p_response_code, updated_at = now_ts,
                      expires_at = now_ts + ttl, owner_oid = me_oid,
                      owner_system = plp_system_identifier()
   WHERE owner = current_user AND scope = p_scope AND key = p_key AND lease_token = p_token
     AND status = 'processing' AND expires_at > now_ts
     AND (owner_oid IS NULL OR owner_oid = me_oid OR owner_system <> plp_system_identifier());
  IF NOT FOUND THEN
    RAISE EXCEPTION 'token does not hold key %', p_key USING ERRCODE = '55000';
  END IF;
  RETURN 'replay';
END
$$;
