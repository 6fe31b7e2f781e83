-- The portable edition's functions (version 1.2.0): the public API of the C++ edition under the
-- same names, argument names, types and defaults, in PL/pgSQL. Every function runs as its
-- caller (SECURITY INVOKER): a key belongs to current_user, and the table's row-level security
-- (base.sql) holds a role to its own rows whatever it runs. The public functions pin
-- search_path (but the usual calls of claim_key and complete_key, from 1.3.2: see there); the
-- internal ones ("Internal:" in their comments) run under the pin of the public function that
-- calls them (a switch of search_path per call would cost each of them the recomputation of
-- the path and of its cached plans' check).
-- CREATE OR REPLACE throughout: the one-file install runs this file again on every update.

-------------------------------------------------------------------------------
-- Settings. The C++ edition's settings are superuser-only; here they are placeholders any
-- session may set for itself, so each is read within the C++ edition's range (22023
-- outside it), and the table's CHECK holds the largest values whatever is set.
-------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION idempotency.setting_value(name pg_catalog.text, fallback pg_catalog.int8,
                                                     lowest pg_catalog.int8, highest pg_catalog.int8,
                                                     unit pg_catalog.text)
RETURNS pg_catalog.int8
LANGUAGE plpgsql STABLE SECURITY INVOKER PARALLEL SAFE
AS $$
DECLARE
  raw text := current_setting('idempotency.' || name, true);
  parts text[];
  amount numeric;
BEGIN
  IF raw IS NULL OR raw = '' THEN
    RETURN fallback;
  END IF;
  parts := regexp_match(btrim(raw), '^(-?[0-9]+)\s*([A-Za-z]*)$');
  BEGIN
    IF parts IS NULL AND unit = 's' THEN
      amount := extract(epoch FROM raw::interval);
    ELSIF parts IS NULL THEN
      RAISE invalid_parameter_value;
    ELSE
      amount := parts[1]::numeric * CASE
        WHEN parts[2] = '' THEN 1
        WHEN unit = 'B' AND parts[2] = 'B' THEN 1
        WHEN unit = 'B' AND parts[2] = 'kB' THEN 1024
        WHEN unit = 'B' AND parts[2] = 'MB' THEN 1024 * 1024
        WHEN unit = 'B' AND parts[2] = 'GB' THEN 1024 * 1024 * 1024
        WHEN unit = 's' THEN extract(epoch FROM ('1 ' || parts[2])::interval)
        ELSE NULL END;
    END IF;
  EXCEPTION WHEN OTHERS THEN
    amount := NULL;
  END;
  IF amount IS NULL OR amount <> trunc(amount) OR amount < lowest OR amount > highest THEN
    RAISE EXCEPTION 'invalid value for parameter "idempotency.%": "%"', name, raw
      USING ERRCODE = '22023',
            DETAIL = format('Allowed: %s to %s%s.', lowest, highest, CASE unit WHEN '' THEN '' ELSE ' ' || unit END);
  END IF;
  RETURN amount;
END
$$;
COMMENT ON FUNCTION idempotency.setting_value(text, bigint, bigint, bigint, text) IS
  'Internal: the setting idempotency.<name> as a whole number (s or bytes when unit says so), '
  'fallback when unset; 22023 outside lowest to highest.';

-- An interval as one span of microseconds, a month counted as 30 days and a day as 24 hours
-- (as the C++ edition reads a ttl, lease or wait, and as PostgreSQL compares intervals).
CREATE OR REPLACE FUNCTION idempotency.as_span(value pg_catalog.interval, name pg_catalog.text)
RETURNS pg_catalog.interval
LANGUAGE plpgsql IMMUTABLE SECURITY INVOKER PARALLEL SAFE
AS $$
DECLARE
  months int := extract(year FROM value)::int * 12 + extract(month FROM value)::int;
  days int := extract(day FROM value)::int;
BEGIN
  IF months = 0 AND days = 0 THEN
    RETURN value;
  END IF;
  RETURN (value - make_interval(months => months, days => days))
         + (months::int8 * 30 + days) * interval '24 hours';
EXCEPTION WHEN datetime_field_overflow OR interval_field_overflow OR numeric_value_out_of_range THEN
  RAISE EXCEPTION '% is out of range', name USING ERRCODE = '22023';
END
$$;
COMMENT ON FUNCTION idempotency.as_span(interval, text) IS
  'Internal: an interval as microseconds only (a month = 30 days, a day = 24 hours).';

-- A ttl or lease: positive and at most idempotency.max_<name>; NULL takes
-- idempotency.default_<name>, held to the same maximum.
CREATE OR REPLACE FUNCTION idempotency.checked_interval(value pg_catalog.interval, name pg_catalog.text)
RETURNS pg_catalog.interval
LANGUAGE plpgsql STABLE SECURITY INVOKER PARALLEL SAFE
AS $$
DECLARE
  highest int8 := idempotency.setting_value('max_' || name, CASE name WHEN 'ttl' THEN 2592000 ELSE 86400 END,
                                            1, 2147483647, 's');
  fallback int8;
  span interval;
BEGIN
  IF value IS NULL THEN
    fallback := idempotency.setting_value('default_' || name, CASE name WHEN 'ttl' THEN 86400 ELSE 300 END,
                                          1, 2147483647, 's');
    IF fallback > highest THEN
      RAISE EXCEPTION 'idempotency.default_% exceeds idempotency.max_%', name, name USING ERRCODE = '22023',
        DETAIL = format('idempotency.default_%s is %s s; idempotency.max_%s is %s s.', name, fallback, name, highest);
    END IF;
    RETURN fallback * interval '1 second';
  END IF;
  span := idempotency.as_span(value, name);
  IF span <= interval '0' THEN
    RAISE EXCEPTION '% must be positive', name USING ERRCODE = '22023',
      HINT = format('Pass NULL to use idempotency.default_%s.', name);
  END IF;
  IF span > highest * interval '1 second' THEN
    RAISE EXCEPTION '% exceeds idempotency.max_%', name, name USING ERRCODE = '22023',
      DETAIL = format('idempotency.max_%s is %s s.', name, highest);
  END IF;
  RETURN span;
END
$$;
COMMENT ON FUNCTION idempotency.checked_interval(interval, text) IS
  'Internal: a ttl or lease checked against its limits (22023), or its default when NULL.';

-- A key and scope: not NULL (22004), the key not empty (22023), both at most
-- idempotency.max_key_length bytes (22001).
CREATE OR REPLACE FUNCTION idempotency.check_name(key pg_catalog.text, scope pg_catalog.text)
RETURNS void
LANGUAGE plpgsql STABLE SECURITY INVOKER PARALLEL SAFE
AS $$
DECLARE
  limit_bytes int8;
BEGIN
  IF key IS NULL THEN
    RAISE EXCEPTION 'idempotency key must not be null' USING ERRCODE = '22004';
  END IF;
  IF scope IS NULL THEN
    RAISE EXCEPTION 'idempotency scope must not be null' USING ERRCODE = '22004',
      HINT = 'Use '''' (the default) for keys without a scope.';
  END IF;
  IF key = '' THEN
    RAISE EXCEPTION 'idempotency key must not be empty' USING ERRCODE = '22023';
  END IF;
  limit_bytes := idempotency.setting_value('max_key_length', 255, 1, 1024, '');
  IF octet_length(key) > limit_bytes THEN
    RAISE EXCEPTION 'idempotency key is too long' USING ERRCODE = '22001',
      DETAIL = format('The key has %s bytes; idempotency.max_key_length is %s.', octet_length(key), limit_bytes);
  END IF;
  IF octet_length(scope) > limit_bytes THEN
    RAISE EXCEPTION 'idempotency scope is too long' USING ERRCODE = '22001',
      DETAIL = format('The scope has %s bytes; idempotency.max_key_length is %s.', octet_length(scope), limit_bytes);
  END IF;
END
$$;
COMMENT ON FUNCTION idempotency.check_name(text, text) IS
  'Internal: refuses a NULL (22004), empty (22023) or too long (22001) key or scope.';

-- A bytea or text value of at most idempotency.<setting> bytes (22001).
CREATE OR REPLACE FUNCTION idempotency.check_size(value_bytes pg_catalog.int8, name pg_catalog.text,
                                                  setting pg_catalog.text, fallback pg_catalog.int8,
                                                  highest pg_catalog.int8)
RETURNS void
LANGUAGE plpgsql STABLE SECURITY INVOKER PARALLEL SAFE
AS $$
DECLARE
  limit_bytes int8 := idempotency.setting_value(setting, fallback, 1, highest, 'B');
BEGIN
  IF value_bytes > limit_bytes THEN
    RAISE EXCEPTION '% is too long', name USING ERRCODE = '22001',
      DETAIL = format('The %s has %s bytes; idempotency.%s is %s.', name, value_bytes, setting, limit_bytes);
  END IF;
END
$$;
COMMENT ON FUNCTION idempotency.check_size(bigint, text, text, bigint, bigint) IS
  'Internal: refuses (22001) a fingerprint or recovery point over its limit.';

-------------------------------------------------------------------------------
-- Helpers: fingerprints and UUIDv7 (the same values as the C++ edition's)
-------------------------------------------------------------------------------

-- One token of the canonical stream: a tag byte, a 4-byte big-endian length, the bytes.
CREATE OR REPLACE FUNCTION idempotency.fingerprint_token(tag pg_catalog.text, data pg_catalog.bytea)
RETURNS pg_catalog.bytea
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$ BEGIN RETURN convert_to(tag, 'SQL_ASCII') || int4send(octet_length(data)) || data; END $$;
COMMENT ON FUNCTION idempotency.fingerprint_token(text, bytea) IS
  'Internal: one tagged, length-prefixed token of request_fingerprint''s canonical stream.';

-- The canonical stream of a jsonb value, as the C++ edition hashes it: objects in jsonb's own
-- key order, numbers in normalized form (1.0 and 1.00 alike), every token tagged.
CREATE OR REPLACE FUNCTION idempotency.fingerprint_stream(value pg_catalog.jsonb, top pg_catalog.bool)
RETURNS pg_catalog.bytea
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
DECLARE
  kind text := jsonb_typeof(value);
  stream bytea := '';
  item record;
BEGIN
  IF kind = 'object' THEN
    stream := idempotency.fingerprint_token('{', '');
    FOR item IN SELECT e.key, e.value FROM jsonb_each(value) e LOOP
      stream := stream || idempotency.fingerprint_token('k', convert_to(item.key, getdatabaseencoding()))
                       || idempotency.fingerprint_stream(item.value, false);
    END LOOP;
    RETURN stream || idempotency.fingerprint_token('}', '');
  ELSIF kind = 'array' THEN
    stream := idempotency.fingerprint_token('[', '');
    FOR item IN SELECT e.value FROM jsonb_array_elements(value) e LOOP
      stream := stream || idempotency.fingerprint_stream(item.value, false);
    END LOOP;
    RETURN stream || idempotency.fingerprint_token(']', '');
  END IF;
  stream := CASE kind
    WHEN 'null' THEN idempotency.fingerprint_token('n', '')
    WHEN 'boolean' THEN idempotency.fingerprint_token(CASE WHEN value::text = 'true' THEN 't' ELSE 'f' END, '')
    WHEN 'string' THEN idempotency.fingerprint_token('s', convert_to(value #>> '{}', getdatabaseencoding()))
    ELSE idempotency.fingerprint_token('#', convert_to(trim_scale((value #>> '{}')::numeric)::text, 'SQL_ASCII'))
  END;
  -- A scalar at the top is stored as a one-element pseudo array: 'r', the scalar, ']'.
  IF top THEN
    RETURN idempotency.fingerprint_token('r', '') || stream || idempotency.fingerprint_token(']', '');
  END IF;
  RETURN stream;
END
$$;
COMMENT ON FUNCTION idempotency.fingerprint_stream(jsonb, boolean) IS
  'Internal: the canonical byte stream request_fingerprint(jsonb) hashes.';

-- The stream is built here without calling fingerprint_stream (an explicit stack instead of
-- recursion): the pure helpers name nothing in schema idempotency, so that a role without
-- USAGE calling them through a granted role's function gets an answer, as from the C++
-- edition's (SECURITY.md, least privilege). fingerprint_stream stays as the reference.
CREATE OR REPLACE FUNCTION idempotency.request_fingerprint(payload pg_catalog.jsonb) RETURNS pg_catalog.bytea
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  ops text[];      -- what to do next, last first: 'v' a value, 'k' a key, '}' or ']' a closer
  vals jsonb[];    -- the value of a 'v'
  keys text[];     -- the key of a 'k'
  op text;
  v jsonb;
  kind text;
  stream bytea := '';
  item record;
  entry_keys text[];
  entry_vals jsonb[];
  i int;
  data bytea;
  tag text;
BEGIN
  IF jsonb_typeof(payload) NOT IN ('object', 'array') THEN
    stream := convert_to('r', 'SQL_ASCII') || int4send(0);
    ops := ARRAY[']', 'v']; vals := ARRAY[NULL, payload]::jsonb[]; keys := ARRAY[NULL, NULL]::text[];
  ELSE
    ops := ARRAY['v']; vals := ARRAY[payload]; keys := ARRAY[NULL]::text[];
  END IF;
  WHILE cardinality(ops) > 0 LOOP
    op := ops[cardinality(ops)]; v := vals[cardinality(ops)]; tag := keys[cardinality(ops)];
    ops := ops[1:cardinality(ops) - 1]; vals := vals[1:cardinality(vals) - 1]; keys := keys[1:cardinality(keys) - 1];
    IF op IN ('}', ']') THEN
      stream := stream || convert_to(op, 'SQL_ASCII') || int4send(0);
      CONTINUE;
    ELSIF op = 'k' THEN
      data := convert_to(tag, getdatabaseencoding());
      stream := stream || convert_to('k', 'SQL_ASCII') || int4send(octet_length(data)) || data;
      CONTINUE;
    END IF;
    kind := jsonb_typeof(v);
    IF kind = 'object' THEN
      stream := stream || convert_to('{', 'SQL_ASCII') || int4send(0);
      SELECT coalesce(array_agg(e.key ORDER BY n), '{}'), coalesce(array_agg(e.value ORDER BY n), '{}')
        INTO entry_keys, entry_vals FROM jsonb_each(v) WITH ORDINALITY AS e(key, value, n);
      ops := ops || '}'::text; vals := vals || NULL::jsonb; keys := keys || NULL::text;
      FOR i IN REVERSE cardinality(entry_keys) .. 1 LOOP
        ops := ops || 'v'::text; vals := vals || entry_vals[i]; keys := keys || NULL::text;
        ops := ops || 'k'::text; vals := vals || NULL::jsonb; keys := keys || entry_keys[i];
      END LOOP;
    ELSIF kind = 'array' THEN
      stream := stream || convert_to('[', 'SQL_ASCII') || int4send(0);
      SELECT coalesce(array_agg(e.value ORDER BY n), '{}') INTO entry_vals
        FROM jsonb_array_elements(v) WITH ORDINALITY AS e(value, n);
      ops := ops || ']'::text; vals := vals || NULL::jsonb; keys := keys || NULL::text;
      FOR i IN REVERSE cardinality(entry_vals) .. 1 LOOP
        ops := ops || 'v'::text; vals := vals || entry_vals[i]; keys := keys || NULL::text;
      END LOOP;
    ELSE
      IF kind = 'null' THEN
        tag := 'n'; data := '';
      ELSIF kind = 'boolean' THEN
        tag := CASE WHEN v::text = 'true' THEN 't' ELSE 'f' END; data := '';
      ELSIF kind = 'string' THEN
        tag := 's'; data := convert_to(v #>> '{}', getdatabaseencoding());
      ELSE
        tag := '#'; data := convert_to(trim_scale((v #>> '{}')::numeric)::text, 'SQL_ASCII');
      END IF;
      stream := stream || convert_to(tag, 'SQL_ASCII') || int4send(octet_length(data)) || data;
    END IF;
  END LOOP;
  RETURN sha256(stream);
END
$$;
COMMENT ON FUNCTION idempotency.request_fingerprint(jsonb) IS
  'SHA-256 of a jsonb payload; values equal as jsonb (any key order or spacing) give equal '
  'fingerprints, the same as the C++ edition''s.';

CREATE OR REPLACE FUNCTION idempotency.request_fingerprint(payload pg_catalog.text) RETURNS pg_catalog.bytea
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$ BEGIN RETURN sha256(convert_to(payload, getdatabaseencoding())); END $$;
COMMENT ON FUNCTION idempotency.request_fingerprint(text) IS 'SHA-256 of the text''s bytes.';

CREATE OR REPLACE FUNCTION idempotency.request_fingerprint(payload pg_catalog.bytea) RETURNS pg_catalog.bytea
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$ BEGIN RETURN sha256(payload); END $$;
COMMENT ON FUNCTION idempotency.request_fingerprint(bytea) IS 'SHA-256 of the bytes.';

-- A UUIDv7 from a count of 1/4096 ms since 1970 and 62 random bits (variant 10) taken from
-- gen_random_uuid (a CSPRNG; its last 8 bytes carry variant 10 already).
CREATE OR REPLACE FUNCTION idempotency.uuid_v7_of(units pg_catalog.int8) RETURNS pg_catalog.uuid
LANGUAGE plpgsql VOLATILE STRICT PARALLEL SAFE
AS $$
BEGIN
  RETURN (lpad(to_hex(units >> 12), 12, '0') || '7' || lpad(to_hex(units & 4095), 3, '0')
          || right(replace(gen_random_uuid()::text, '-', ''), 16))::uuid;
END
$$;
COMMENT ON FUNCTION idempotency.uuid_v7_of(bigint) IS
  'Internal: a UUIDv7 from 1/4096 ms since 1970 (48 bits of ms, 12 of fraction) and random bits.';

CREATE OR REPLACE FUNCTION idempotency.gen_uuid_v7(at pg_catalog.timestamptz) RETURNS pg_catalog.uuid
LANGUAGE plpgsql VOLATILE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  unix_us numeric;
  units int8;
BEGIN
  IF NOT isfinite(at) THEN
    RAISE EXCEPTION 'timestamp out of range for a UUIDv7: %', at USING ERRCODE = '22008';
  END IF;
  unix_us := extract(epoch FROM at) * 1000000;
  IF unix_us < 0 OR floor(unix_us / 1000) > 281474976710655 THEN
    RAISE EXCEPTION 'timestamp out of range for a UUIDv7: %', at USING ERRCODE = '22008',
      DETAIL = 'A UUIDv7 holds times from 1970-01-01 00:00:00 UTC to 10889-08-02 05:31:50.655 UTC (48 bits of Unix milliseconds).';
  END IF;
  units := (floor(unix_us / 1000)::int8 << 12) + ((unix_us::int8 % 1000) * 4096 / 1000);
  -- uuid_v7_of's body: nothing in schema idempotency is named (see request_fingerprint).
  RETURN (lpad(to_hex(units >> 12), 12, '0') || '7' || lpad(to_hex(units & 4095), 3, '0')
          || right(replace(gen_random_uuid()::text, '-', ''), 16))::uuid;
END
$$;
COMMENT ON FUNCTION idempotency.gen_uuid_v7(timestamptz) IS
  'A UUID version 7 for the given time (1970 to year 10889; 22008 outside).';

-- Strictly increasing within a session, also within a millisecond and when the clock steps
-- back: the last value's time is kept in a session setting and each value moves on by at
-- least 1/4096 ms. Helpers on the claim path are PL/pgSQL, not SQL functions: PostgreSQL 15
-- plans an SQL function that it cannot inline again at every call, PL/pgSQL once a session.
CREATE OR REPLACE FUNCTION idempotency.uuid_v7_next() RETURNS pg_catalog.uuid
LANGUAGE plpgsql VOLATILE PARALLEL SAFE
AS $$
DECLARE
  unix_us int8 := (extract(epoch FROM clock_timestamp()) * 1000000)::int8;
  units int8 := ((unix_us / 1000) << 12) + (unix_us % 1000) * 4096 / 1000;
  last int8 := coalesce(nullif(current_setting('idempotency_portable.uuid_v7_last', true), '')::int8, 0);
BEGIN
  IF units <= last THEN
    units := last + 1;
  END IF;
  PERFORM set_config('idempotency_portable.uuid_v7_last', units::text, false);
  RETURN (lpad(to_hex(units >> 12), 12, '0') || '7' || lpad(to_hex(units & 4095), 3, '0')
          || right(replace(gen_random_uuid()::text, '-', ''), 16))::uuid;
END
$$;
COMMENT ON FUNCTION idempotency.uuid_v7_next() IS
  'Internal: the next UUIDv7 of this session (gen_uuid_v7 without its search_path switch).';

-- A claim's token: a UUIDv7 of the claim's time and 62 random bits of gen_random_uuid (whose
-- last 8 bytes carry variant 10 already), its first 8 bytes replaced by 48 bits of
-- milliseconds, the version and 12 bits of the fraction. One SQL expression, inlined where it
-- is used: no session state to read and write as uuid_v7_next does (a token need not be
-- strictly increasing within a session, only unique and of its claim's time, which
-- explain_fence reads back).
CREATE OR REPLACE FUNCTION idempotency.uuid_v7_at(at pg_catalog.timestamptz) RETURNS pg_catalog.uuid
LANGUAGE sql VOLATILE PARALLEL SAFE
AS $$
  -- (µs / 1000) << 16 | 0x7000 (version 7) | (µs % 1000) * 4096 / 1000, µs since 1970
  SELECT pg_catalog.encode(pg_catalog.overlay(
           pg_catalog.uuid_send(pg_catalog.gen_random_uuid()),
           pg_catalog.int8send(
             ((pg_catalog."extract"('epoch', $1) OPERATOR(pg_catalog.*) 1000000)::pg_catalog.int8
                OPERATOR(pg_catalog./) 1000 OPERATOR(pg_catalog.<<) 16)
             OPERATOR(pg_catalog.|) 28672
             OPERATOR(pg_catalog.|) ((pg_catalog."extract"('epoch', $1) OPERATOR(pg_catalog.*) 1000000)::pg_catalog.int8
                                       OPERATOR(pg_catalog.%) 1000 OPERATOR(pg_catalog.*) 4096 OPERATOR(pg_catalog./) 1000)),
           1, 8), 'hex')::pg_catalog.uuid
$$;
COMMENT ON FUNCTION idempotency.uuid_v7_at(timestamptz) IS
  'Internal: a UUIDv7 of the given time (a claim''s token), random bits from gen_random_uuid (inlined by the planner).';

CREATE OR REPLACE FUNCTION idempotency.gen_uuid_v7() RETURNS pg_catalog.uuid
LANGUAGE plpgsql VOLATILE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
-- The body of uuid_v7_next, which a role without USAGE could not call (see request_fingerprint).
DECLARE
  unix_us int8 := (extract(epoch FROM clock_timestamp()) * 1000000)::int8;
  units int8 := ((unix_us / 1000) << 12) + (unix_us % 1000) * 4096 / 1000;
  last int8 := coalesce(nullif(current_setting('idempotency_portable.uuid_v7_last', true), '')::int8, 0);
BEGIN
  IF units <= last THEN
    units := last + 1;
  END IF;
  PERFORM set_config('idempotency_portable.uuid_v7_last', units::text, false);
  RETURN (lpad(to_hex(units >> 12), 12, '0') || '7' || lpad(to_hex(units & 4095), 3, '0')
          || right(replace(gen_random_uuid()::text, '-', ''), 16))::uuid;
END
$$;
COMMENT ON FUNCTION idempotency.gen_uuid_v7() IS
  'A UUID version 7 (RFC 9562, PostgreSQL 18 layout): time-ordered, strictly increasing '
  'within a session, 62 random bits from a CSPRNG.';

CREATE OR REPLACE FUNCTION idempotency.uuid_v7_time(id pg_catalog.uuid) RETURNS pg_catalog.timestamptz
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  h text := replace(id::text, '-', '');
BEGIN
  IF substr(h, 13, 1) = '7' AND substr(h, 17, 1) IN ('8', '9', 'a', 'b') THEN
    RETURN timestamptz 'epoch' + ('x' || lpad(substr(h, 1, 12), 16, '0'))::bit(64)::int8 * interval '1 millisecond';
  END IF;
  RETURN NULL;
END
$$;
COMMENT ON FUNCTION idempotency.uuid_v7_time(uuid) IS
  'The time (millisecond precision) a version 7 UUID carries; NULL for other versions.';

-------------------------------------------------------------------------------
-- The claim protocol
-------------------------------------------------------------------------------

-- The tag of the transaction-level advisory lock of an owner's (scope, key): 64 bits of
-- SHA-256 over the owner's own secret and the key's identity. One SQL expression, inlined
-- where it is used (key_lock_tag and claim_key's claim of an absent key), so that both
-- compute the same tag for the same key.
CREATE OR REPLACE FUNCTION idempotency.lock_tag_of(secret pg_catalog.bytea, owner pg_catalog.text,
                                                   scope pg_catalog.text, key pg_catalog.text)
RETURNS pg_catalog.int8
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
  SELECT ('x' OPERATOR(pg_catalog.||) pg_catalog.encode(pg_catalog.substr(pg_catalog.sha256(
            $1 OPERATOR(pg_catalog.||) pg_catalog.convert_to($2, 'UTF8') OPERATOR(pg_catalog.||) '\x00'::pg_catalog.bytea
            OPERATOR(pg_catalog.||) pg_catalog.convert_to($3, 'UTF8') OPERATOR(pg_catalog.||) '\x00'::pg_catalog.bytea
            OPERATOR(pg_catalog.||) pg_catalog.convert_to($4, 'UTF8')), 1, 8), 'hex'))::pg_catalog.bit(64)::pg_catalog.int8
$$;
COMMENT ON FUNCTION idempotency.lock_tag_of(bytea, text, text, text) IS
  'Internal: the advisory lock tag of (owner, scope, key) keyed by the owner''s secret (inlined by the planner).';

-- The tag of the caller's (scope, key). Makes the secret on a role's first claim (a first
-- claim of the same role in a concurrent transaction then waits for it).
CREATE OR REPLACE FUNCTION idempotency.key_lock_tag(scope pg_catalog.text, key pg_catalog.text)
RETURNS pg_catalog.int8
LANGUAGE plpgsql VOLATILE SECURITY INVOKER PARALLEL UNSAFE
AS $$
#variable_conflict use_variable
DECLARE
  me text := current_user;
  role_secret bytea;
BEGIN
  SELECT s.secret INTO role_secret FROM idempotency.role_secrets s WHERE s.owner = me;
  IF NOT FOUND THEN
    INSERT INTO idempotency.role_secrets (owner) VALUES (me) ON CONFLICT DO NOTHING;
    SELECT s.secret INTO STRICT role_secret FROM idempotency.role_secrets s WHERE s.owner = me;
  END IF;
  RETURN idempotency.lock_tag_of(role_secret, me, scope, key);
END
$$;
COMMENT ON FUNCTION idempotency.key_lock_tag(text, text) IS
  'Internal: the advisory lock tag of the caller''s (scope, key), keyed by the caller''s own secret.';

-- The answer read from a stored row: replay (the response as stored) or mismatch (the stored
-- fingerprint only).
CREATE OR REPLACE FUNCTION idempotency.stored_answer(answer idempotency.claim_status,
                                                     r idempotency.idempotency_keys)
RETURNS idempotency.claim_result
LANGUAGE plpgsql VOLATILE PARALLEL SAFE
AS $$
DECLARE
  -- A response past its response_expires_at (complete_key's response_ttl) is not replayed,
  -- whether or not the cleanup dropped it yet: the code is, and response_dropped says so.
  kept boolean := answer = 'replay' AND (r.response_expires_at IS NULL OR r.response_expires_at > clock_timestamp());
BEGIN
  RETURN ROW(answer, NULL,
             CASE WHEN kept THEN r.response END,
             CASE WHEN answer = 'replay' THEN r.response_code END,
             r.fingerprint,
             CASE WHEN answer = 'replay' THEN r.recovery_point END,
             r.attempts, r.created_at, r.expires_at, NULL,
             CASE WHEN kept THEN r.response_body END,
             CASE WHEN kept THEN r.response_headers END,
             CASE WHEN answer = 'replay' THEN NOT kept END)::idempotency.claim_result;
END
$$;
COMMENT ON FUNCTION idempotency.stored_answer(idempotency.claim_status, idempotency.idempotency_keys) IS
  'Internal: the claim_result of a replay, a mismatch (or a look''s in_progress and reclaimed), read from the stored row.';

CREATE OR REPLACE FUNCTION idempotency.claim_key_checked(
  key         pg_catalog.text,
  fingerprint pg_catalog.bytea    DEFAULT NULL,
  scope       pg_catalog.text     DEFAULT '',
  ttl         pg_catalog.interval DEFAULT NULL,
  lease       pg_catalog.interval DEFAULT NULL,
  wait        pg_catalog.interval DEFAULT '0')
RETURNS idempotency.claim_result
LANGUAGE plpgsql VOLATILE SECURITY INVOKER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
  me text := current_user;
  k text := claim_key_checked.key;
  sc text := claim_key_checked.scope;
  fp bytea := claim_key_checked.fingerprint;
  v_ttl interval;
  v_lease interval;
  started timestamptz := clock_timestamp();
  deadline timestamptz;
  now_ts timestamptz;
  r idempotency.idempotency_keys;
  found_row boolean;
  locked boolean := false;
  tag int8;
  tok uuid;
  until timestamptz;
  expiry timestamptz;
  retries int := 0;
  pause float8 := 0.001;
  me_oid oid;
  here int8;
  foreign_row boolean;
  claimed idempotency.claim_result;  -- the answer of the one-statement claim (other fields NULL)
BEGIN
  IF NOT pg_catalog.has_schema_privilege('idempotency', 'USAGE') THEN
    RAISE EXCEPTION 'permission denied for schema idempotency' USING ERRCODE = '42501',
      DETAIL = 'Calls reached by OID (a BEGIN ATOMIC body, a view, a kept plan) are checked too.';
  END IF;
  -- The usual call (no setting of this edition set, the arguments within the defaults' limits,
  -- default ttl and lease, no wait) is checked in one expression: a PL/pgSQL expression or
  -- helper call is set up again in each transaction, and a claim is often the only call of
  -- its transaction. Any other call goes through the helpers, which say what is wrong (NULL,
  -- empty or too long, a bad setting); the defaults here are theirs.
  IF k <> '' AND octet_length(k) <= 255 AND octet_length(sc) <= 255
     AND (fp IS NULL OR octet_length(fp) <= 64)
     AND claim_key_checked.ttl IS NULL AND claim_key_checked.lease IS NULL AND claim_key_checked.wait = interval '0'
     AND concat(current_setting('idempotency.max_key_length', true),
                current_setting('idempotency.max_fingerprint_size', true),
                current_setting('idempotency.default_ttl', true),
                current_setting('idempotency.max_ttl', true),
                current_setting('idempotency.default_lease', true),
                current_setting('idempotency.max_lease', true)) = '' THEN
    v_ttl := interval '86400 seconds';
    v_lease := interval '300 seconds';
    deadline := started;
  ELSE
    PERFORM idempotency.check_name(k, sc);
    IF fp IS NOT NULL THEN
      PERFORM idempotency.check_size(octet_length(fp), 'fingerprint', 'max_fingerprint_size', 64, 1024);
    END IF;
    v_ttl := idempotency.checked_interval(claim_key_checked.ttl, 'ttl');
    v_lease := idempotency.checked_interval(claim_key_checked.lease, 'lease');
    IF claim_key_checked.wait IS NULL THEN
      deadline := started;
    ELSE
      IF idempotency.as_span(claim_key_checked.wait, 'wait') < interval '0' THEN
        RAISE EXCEPTION 'wait must not be negative' USING ERRCODE = '22023';
      END IF;
      deadline := started + idempotency.as_span(claim_key_checked.wait, 'wait');
    END IF;
  END IF;

  LOOP
    now_ts := clock_timestamp();
    -- Look: the row this statement's snapshot sees (a new one each time at READ COMMITTED).
    SELECT * INTO r FROM idempotency.idempotency_keys t
     WHERE t.key = k AND t.scope = sc AND t.owner = me;
    found_row := FOUND;
    IF NOT found_row AND NOT locked THEN
      -- An absent key, the usual new claim: the key's lock, tagged with the role's secret, and
      -- the row in one statement (the lock is tried before the insert, so a claim in an open
      -- transaction is never waited for on the unique index). Nothing inserted (the role has
      -- no secret yet, an open claim holds the lock, a row was committed since the look):
      -- the steps below decide, as for any key.
      INSERT INTO idempotency.idempotency_keys AS t
             (owner, scope, key, fingerprint, attempts, ttl, lease, created_at, expires_at,
              lease_token, locked_until, status, updated_at, owner_oid, owner_system)
      SELECT me, sc, k, fp, 1, v_ttl, v_lease, now_ts, greatest(now_ts + v_ttl, now_ts + v_lease),
             idempotency.uuid_v7_at(now_ts), now_ts + v_lease, 'processing', now_ts,
             quote_ident(me)::regrole::oid, idempotency.system_identifier()
        FROM idempotency.role_secrets s
       WHERE s.owner = me AND pg_try_advisory_xact_lock(idempotency.lock_tag_of(s.secret, me, sc, k))
      ON CONFLICT (key, scope, owner) DO NOTHING
      RETURNING 'claimed', t.lease_token, t.fingerprint, t.attempts, t.created_at, t.expires_at
           INTO claimed.status, claimed.token, claimed.fingerprint, claimed.attempts,
                claimed.created_at, claimed.expires_at;
      IF FOUND THEN
        RETURN claimed;
      END IF;
    END IF;
    -- A row of the caller's name stamped here by another role (an earlier role of this name)
    -- is absent for the caller: a claim replaces it with a fresh one.
    foreign_row := false;
    IF found_row AND r.owner_oid IS NOT NULL AND r.owner_system IS NOT NULL THEN
      me_oid := coalesce(me_oid, quote_ident(me)::regrole::oid);
      IF r.owner_oid <> me_oid THEN
        here := coalesce(here, idempotency.system_identifier());
        foreign_row := r.owner_system = here;
      END IF;
    END IF;
    IF found_row AND NOT foreign_row AND r.expires_at > now_ts THEN
      IF fp IS NOT NULL AND r.fingerprint IS NOT NULL AND r.fingerprint <> fp THEN
        RETURN idempotency.stored_answer('mismatch', r);
      END IF;
      IF r.status = 'completed' THEN
        RETURN idempotency.stored_answer('replay', r);   -- no lock taken, nothing written
      END IF;
      IF r.lease_token IS NOT NULL AND r.locked_until > now_ts THEN
        IF now_ts >= deadline THEN
          RETURN ROW('in_progress', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                     greatest(r.locked_until - now_ts, interval '1 millisecond'), NULL, NULL, NULL)::idempotency.claim_result;
        END IF;
        -- A snapshot transaction would look at the same version for ever: a version committed
        -- after its snapshot (the holder completed or released) raises 40001 here, as a
        -- row lock of that version does. The lock is taken in a subtransaction that is then
        -- rolled back, so none is kept (a kept one would hide the next version from this
        -- check); a holder's row lock is not waited for.
        IF current_setting('transaction_isolation') <> 'read committed' THEN
          BEGIN
            PERFORM FROM idempotency.idempotency_keys t
             WHERE t.key = k AND t.scope = sc AND t.owner = me FOR SHARE NOWAIT;
            RAISE EXCEPTION USING ERRCODE = 'IK001';  -- undo the lock
          EXCEPTION WHEN lock_not_available OR SQLSTATE 'IK001' THEN
            NULL;
          END;
        END IF;
        PERFORM pg_sleep(least(pause, extract(epoch FROM deadline - now_ts)::float8));
        pause := least(pause * 2, 0.05);
        CONTINUE;
      END IF;
    END IF;

    -- Absent, expired, released or lease ended: every write of a claim holds the key's lock.
    -- A claim in a transaction still open holds it: wait = 0 answers at once, wait > 0
    -- tries again after sleeping until that transaction ends or the deadline passes.
    IF NOT locked THEN
      tag := idempotency.key_lock_tag(sc, k);
      IF NOT pg_try_advisory_xact_lock(tag) THEN
        now_ts := clock_timestamp();
        IF now_ts >= deadline THEN
          RETURN ROW('in_progress', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                     interval '1 second', NULL, NULL, NULL)::idempotency.claim_result;
        END IF;
        -- Sleep and try again, backing off from 1 to 50 ms (as the C++ edition waits without
        -- shared memory): interruptible, bounded by the deadline, never a busy loop.
        PERFORM pg_sleep(least(pause, extract(epoch FROM deadline - now_ts)::float8));
        pause := least(pause * 2, 0.05);
        CONTINUE;
      END IF;
      -- No look again under the lock: a row committed since the look makes the insert
      -- conflict (and the take-over reads the row again under its row lock), and then the
      -- loop looks again.
      locked := true;
    END IF;

    tok := idempotency.uuid_v7_at(now_ts);
    me_oid := coalesce(me_oid, quote_ident(me)::regrole::oid);
    here := coalesce(here, idempotency.system_identifier());
    until := now_ts + v_lease;
    expiry := greatest(now_ts + v_ttl, until);
    IF NOT found_row THEN
      INSERT INTO idempotency.idempotency_keys AS t
             (owner, scope, key, fingerprint, attempts, ttl, lease, created_at, expires_at,
              lease_token, locked_until, status, updated_at, owner_oid, owner_system)
      VALUES (me, sc, k, fp, 1, v_ttl, v_lease, now_ts, expiry, tok, until, 'processing', now_ts,
              me_oid, here)
      ON CONFLICT (key, scope, owner) DO NOTHING;
      IF FOUND THEN
        RETURN ROW('claimed', tok, NULL, NULL, fp, NULL, 1, now_ts, expiry, NULL, NULL, NULL, NULL)::idempotency.claim_result;
      END IF;
    ELSE
      -- Take over under the row lock, skipping a row another transaction holds (the cleanup,
      -- a holder finishing): never waited for.
      SELECT * INTO r FROM idempotency.idempotency_keys t
       WHERE t.key = k AND t.scope = sc AND t.owner = me
         FOR UPDATE SKIP LOCKED;
      IF FOUND AND (r.expires_at <= now_ts
                    OR (r.owner_oid <> me_oid AND r.owner_system = here)) THEN
        UPDATE idempotency.idempotency_keys t
           SET fingerprint = fp, attempts = 1, ttl = v_ttl, lease = v_lease, created_at = now_ts,
               expires_at = expiry, lease_token = tok, locked_until = until, recovery_point = NULL,
               status = 'processing', response_code = NULL, updated_at = now_ts, response = NULL,
               response_body = NULL, response_headers = NULL, response_expires_at = NULL,
               owner_oid = me_oid, owner_system = here
         WHERE t.key = k AND t.scope = sc AND t.owner = me;
        RETURN ROW('claimed', tok, NULL, NULL, fp, NULL, 1, now_ts, expiry, NULL, NULL, NULL, NULL)::idempotency.claim_result;
      ELSIF FOUND AND r.status = 'processing'
            AND NOT (fp IS NOT NULL AND r.fingerprint IS NOT NULL AND r.fingerprint <> fp)
            AND NOT (r.lease_token IS NOT NULL AND r.locked_until > now_ts) THEN
        UPDATE idempotency.idempotency_keys t
           SET fingerprint = coalesce(t.fingerprint, fp), attempts = t.attempts + 1, ttl = v_ttl,
               lease = v_lease, expires_at = expiry, lease_token = tok, locked_until = until,
               updated_at = now_ts, owner_oid = me_oid, owner_system = here
         WHERE t.key = k AND t.scope = sc AND t.owner = me
        RETURNING * INTO r;
        RETURN ROW('reclaimed', tok, NULL, NULL, r.fingerprint, r.recovery_point, r.attempts,
                   r.created_at, expiry, NULL, NULL, NULL, NULL)::idempotency.claim_result;
      END IF;
    END IF;
    -- The row changed or is held since the look: look again at once, twice, then wait as
    -- for a holder.
    retries := retries + 1;
    IF retries > 2 THEN
      now_ts := clock_timestamp();
      IF now_ts >= deadline THEN
        RETURN ROW('in_progress', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                   interval '1 second', NULL, NULL, NULL)::idempotency.claim_result;
      END IF;
      PERFORM pg_sleep(least(pause, extract(epoch FROM deadline - now_ts)::float8));
      pause := least(pause * 2, 0.05);
    END IF;
  END LOOP;
END
$$;
COMMENT ON FUNCTION idempotency.claim_key_checked(text, bytea, text, interval, interval, interval) IS
  'Internal: claim_key of any call, with every argument checked by the helpers under a pinned '
  'search_path (claim_key answers the usual new key and replay itself).';

-- claim_key pins no search_path either (1.3.2, as complete_key below): every name of this body
-- is schema-qualified, operators and casts included, and nothing resolves through the caller's
-- path. It answers the usual call (the defaults, no setting of this edition set: the one
-- expression of claim_key_checked) of a new key (the look, then the key's lock and the row in
-- one statement) and of a replay (a row of the caller, not stamped here by another role, live,
-- completed, of no other fingerprint); anything else, or a new key not inserted (the role has
-- no secret yet, an open claim holds the lock, a row was committed since the look), goes to
-- claim_key_checked, which looks again and decides as before.
CREATE OR REPLACE FUNCTION idempotency.claim_key(
  key         pg_catalog.text,
  fingerprint pg_catalog.bytea    DEFAULT NULL,
  scope       pg_catalog.text     DEFAULT '',
  ttl         pg_catalog.interval DEFAULT NULL,
  lease       pg_catalog.interval DEFAULT NULL,
  wait        pg_catalog.interval DEFAULT '0')
RETURNS idempotency.claim_result
LANGUAGE plpgsql VOLATILE SECURITY INVOKER PARALLEL UNSAFE
AS $$
#variable_conflict use_column
DECLARE
  me pg_catalog.text := CURRENT_USER;
  now_ts pg_catalog.timestamptz;
  r idempotency.idempotency_keys;
  kept pg_catalog.bool;
  claimed idempotency.claim_result;  -- the answer of the one-statement claim (other fields NULL)
BEGIN
  IF NOT pg_catalog.has_schema_privilege('idempotency', 'USAGE') THEN
    RAISE EXCEPTION 'permission denied for schema idempotency' USING ERRCODE = '42501',
      DETAIL = 'Calls reached by OID (a BEGIN ATOMIC body, a view, a kept plan) are checked too.';
  END IF;
  IF (claim_key.key OPERATOR(pg_catalog.<>) ''
      AND pg_catalog.octet_length(claim_key.key) OPERATOR(pg_catalog.<=) 255
      AND pg_catalog.octet_length(claim_key.scope) OPERATOR(pg_catalog.<=) 255
      AND (claim_key.fingerprint IS NULL OR pg_catalog.octet_length(claim_key.fingerprint) OPERATOR(pg_catalog.<=) 64)
      AND claim_key.ttl IS NULL AND claim_key.lease IS NULL
      AND claim_key.wait OPERATOR(pg_catalog.=) '0'::pg_catalog.interval
      AND pg_catalog.concat(pg_catalog.current_setting('idempotency.max_key_length', true),
                            pg_catalog.current_setting('idempotency.max_fingerprint_size', true),
                            pg_catalog.current_setting('idempotency.default_ttl', true),
                            pg_catalog.current_setting('idempotency.max_ttl', true),
                            pg_catalog.current_setting('idempotency.default_lease', true),
                            pg_catalog.current_setting('idempotency.max_lease', true))
          OPERATOR(pg_catalog.=) '') IS TRUE THEN
    now_ts := pg_catalog.clock_timestamp();
    -- The owner as the policy writes it (CURRENT_USER, not the variable me): the planner then
    -- sees one condition where it saw two equal ones, and keeps no gate node (a Result with a
    -- one-time filter "me = CURRENT_USER") above the scan of each statement (1.3.3).
    SELECT * INTO r FROM idempotency.idempotency_keys t
     WHERE t.key OPERATOR(pg_catalog.=) claim_key.key AND t.scope OPERATOR(pg_catalog.=) claim_key.scope
       AND t.owner OPERATOR(pg_catalog.=) CURRENT_USER::pg_catalog.text;
    IF NOT FOUND THEN
      -- The default ttl (86400 s) and lease (300 s), as claim_key_checked's usual call.
      INSERT INTO idempotency.idempotency_keys AS t
             (owner, scope, key, fingerprint, attempts, ttl, lease, created_at, expires_at,
              lease_token, locked_until, status, updated_at, owner_oid, owner_system)
      SELECT me, claim_key.scope, claim_key.key, claim_key.fingerprint, 1,
             '86400 seconds'::pg_catalog.interval, '300 seconds'::pg_catalog.interval, now_ts,
             GREATEST(now_ts OPERATOR(pg_catalog.+) '86400 seconds'::pg_catalog.interval,
                      now_ts OPERATOR(pg_catalog.+) '300 seconds'::pg_catalog.interval),
             idempotency.uuid_v7_at(now_ts), now_ts OPERATOR(pg_catalog.+) '300 seconds'::pg_catalog.interval,
             'processing', now_ts,
             pg_catalog.quote_ident(me)::pg_catalog.regrole::pg_catalog.oid, idempotency.system_identifier()
        FROM idempotency.role_secrets s
       WHERE s.owner OPERATOR(pg_catalog.=) CURRENT_USER::pg_catalog.text
         AND pg_catalog.pg_try_advisory_xact_lock(idempotency.lock_tag_of(s.secret, me, claim_key.scope, claim_key.key))
      ON CONFLICT (key, scope, owner) DO NOTHING
      RETURNING 'claimed', t.lease_token, t.fingerprint, t.attempts, t.created_at, t.expires_at
           INTO claimed.status, claimed.token, claimed.fingerprint, claimed.attempts,
                claimed.created_at, claimed.expires_at;
      IF FOUND THEN
        RETURN claimed;
      END IF;
    ELSIF r.expires_at OPERATOR(pg_catalog.>) now_ts AND r.status OPERATOR(pg_catalog.=) 'completed'
          AND NOT (claim_key.fingerprint IS NOT NULL AND r.fingerprint IS NOT NULL
                   AND r.fingerprint OPERATOR(pg_catalog.<>) claim_key.fingerprint)
          AND (r.owner_oid IS NULL OR r.owner_system IS NULL
               OR r.owner_oid OPERATOR(pg_catalog.=) pg_catalog.quote_ident(me)::pg_catalog.regrole::pg_catalog.oid
               OR r.owner_system OPERATOR(pg_catalog.<>) idempotency.system_identifier()) THEN
      -- A replay, no lock taken, nothing written: stored_answer('replay', r) written out.
      kept := r.response_expires_at IS NULL OR r.response_expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp();
      RETURN ROW('replay', NULL, CASE WHEN kept THEN r.response END, r.response_code, r.fingerprint,
                 r.recovery_point, r.attempts, r.created_at, r.expires_at, NULL,
                 CASE WHEN kept THEN r.response_body END, CASE WHEN kept THEN r.response_headers END,
                 NOT kept)::idempotency.claim_result;
    END IF;
  END IF;
  RETURN idempotency.claim_key_checked(claim_key.key, claim_key.fingerprint, claim_key.scope,
                                       claim_key.ttl, claim_key.lease, claim_key.wait);
END
$$;
COMMENT ON FUNCTION idempotency.claim_key(text, bytea, text, interval, interval, interval) IS
  'Claims (scope, key) inside the caller''s transaction, or answers replay / mismatch / '
  'in_progress. Waits at most `wait` for a holder to finish.';

-------------------------------------------------------------------------------
-- Completion, release, checkpoint: fenced by the token
-------------------------------------------------------------------------------

-- Why a fenced statement matched no row, raised; returns the row only when the key was
-- completed with this very token (the caller decides whether that is a no-op).
CREATE OR REPLACE FUNCTION idempotency.explain_fence(key pg_catalog.text, scope pg_catalog.text,
                                                     token pg_catalog.uuid)
RETURNS idempotency.idempotency_keys
LANGUAGE plpgsql VOLATILE SECURITY INVOKER PARALLEL UNSAFE
AS $$
#variable_conflict use_variable
DECLARE
  r idempotency.idempotency_keys;
  described text := format('"%s"', key) || CASE WHEN scope = '' THEN '' ELSE format(' in scope "%s"', scope) END;
  issued timestamptz;
  current_at timestamptz;
  me_oid oid := quote_ident(current_user)::regrole::oid;
  here int8 := idempotency.system_identifier();
BEGIN
  SELECT * INTO r FROM idempotency.idempotency_keys t
   WHERE t.key = key AND t.scope = scope AND t.owner = current_user AND (t.owner_oid IS NULL OR t.owner_system IS NULL OR t.owner_oid = me_oid OR t.owner_system <> here);
  IF NOT FOUND OR r.expires_at <= clock_timestamp() THEN
    RAISE EXCEPTION 'idempotency key % does not exist or has expired', described USING ERRCODE = 'P0002';
  END IF;
  IF r.status = 'completed' AND r.lease_token = token THEN
    RETURN r;
  END IF;
  IF r.status = 'completed' THEN
    RAISE EXCEPTION 'idempotency key % was completed by another claim', described USING ERRCODE = '55000';
  END IF;
  IF r.lease_token IS NULL THEN
    RAISE EXCEPTION 'idempotency key % was released', described USING ERRCODE = '55000',
      DETAIL = 'A released claim cannot be completed; claim the key again.';
  END IF;
  issued := idempotency.uuid_v7_time(token);
  current_at := idempotency.uuid_v7_time(r.lease_token);
  IF issued >= r.created_at - interval '1 millisecond' AND issued <= current_at AND r.attempts > 1 THEN
    RAISE EXCEPTION 'token does not hold idempotency key %', described USING ERRCODE = '55000',
      DETAIL = format('The key is held by attempt %s; this token''s lease ended and the key was claimed again.', r.attempts);
  END IF;
  RAISE EXCEPTION 'token does not hold idempotency key %', described USING ERRCODE = '55000',
    DETAIL = format('This token was never issued for this key; the key is held by attempt %s.', r.attempts),
    HINT = 'Pass the token that claim_key returned for this key.';
END
$$;
COMMENT ON FUNCTION idempotency.explain_fence(text, text, uuid) IS
  'Internal: raises why a fenced completion, release or checkpoint matched no row (P0002 or 55000).';

CREATE OR REPLACE FUNCTION idempotency.check_token(token pg_catalog.uuid) RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
  IF token IS NULL THEN
    RAISE EXCEPTION 'token must not be null' USING ERRCODE = '22004',
      HINT = 'Pass the token that claim_key returned.';
  END IF;
END
$$;
COMMENT ON FUNCTION idempotency.check_token(uuid) IS 'Internal: refuses a NULL token (22004).';

CREATE OR REPLACE FUNCTION idempotency.json_kind(value pg_catalog.jsonb) RETURNS pg_catalog.text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$ BEGIN RETURN CASE jsonb_typeof(value) WHEN 'null' THEN 'null' WHEN 'object' THEN 'an object'
                                      WHEN 'array' THEN 'an array' ELSE 'a ' || jsonb_typeof(value) END; END $$;
COMMENT ON FUNCTION idempotency.json_kind(jsonb) IS 'Internal: "an object", "a string", ... for messages.';

-- The longest prefix of whole characters of at most `bytes` bytes.
CREATE OR REPLACE FUNCTION idempotency.clip_bytes(value pg_catalog.text, bytes pg_catalog.int4) RETURNS pg_catalog.text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
  n int := least(length(value), bytes);
BEGIN
  WHILE octet_length(left(value, n)) > bytes LOOP
    n := n - 1;
  END LOOP;
  RETURN left(value, n);
END
$$;
COMMENT ON FUNCTION idempotency.clip_bytes(text, integer) IS 'Internal: a prefix of whole characters of at most `bytes` bytes.';

-- Response headers: a JSON object of HTTP field names whose values are strings or arrays of
-- strings without control characters (22023).
CREATE OR REPLACE FUNCTION idempotency.check_headers(headers pg_catalog.jsonb) RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
  item record;
  element record;
  hint text := 'Pass a JSON object of header names and values, a value being a string or an array of strings: {"Content-Type": "text/plain", "Vary": ["Accept"]}.';
  shown text;
BEGIN
  IF jsonb_typeof(headers) <> 'object' THEN
    RAISE EXCEPTION 'response headers must be a JSON object' USING ERRCODE = '22023',
      DETAIL = format('The headers are %s.', idempotency.json_kind(headers)),
      HINT = hint;
  END IF;
  FOR item IN SELECT e.key, e.value FROM jsonb_each(headers) e LOOP
    shown := '"' || (SELECT string_agg(CASE WHEN c ~ '[\x01-\x1f\x7f]' THEN '\x' || lpad(to_hex(ascii(c)), 2, '0') ELSE c END, '' ORDER BY n)
                       FROM regexp_split_to_table(idempotency.clip_bytes(item.key, 64), '') WITH ORDINALITY AS ch(c, n))
             || CASE WHEN octet_length(item.key) > 64 THEN '..."' ELSE '"' END;
    IF item.key !~ '^[!#$%&''*+.^_`|~0-9A-Za-z-]+$' THEN
      RAISE EXCEPTION 'response header name % is not an HTTP field name', shown USING ERRCODE = '22023',
        DETAIL = 'A field name is a non-empty token (RFC 9110): letters, digits and !#$%&''*+-.^_`|~.', HINT = hint;
    END IF;
    IF jsonb_typeof(item.value) = 'string' THEN
      IF (item.value #>> '{}') ~ '[\x01-\x08\x0a-\x1f\x7f]' THEN
        RAISE EXCEPTION 'response header % has a control character', shown USING ERRCODE = '22023',
          DETAIL = 'Its value holds a control character other than horizontal tab, which no HTTP field value may hold.', HINT = hint;
      END IF;
    ELSIF jsonb_typeof(item.value) = 'array' THEN
      FOR element IN SELECT e.value, e.n FROM jsonb_array_elements(item.value) WITH ORDINALITY e(value, n) LOOP
        IF jsonb_typeof(element.value) <> 'string' THEN
          RAISE EXCEPTION 'response header % must be a string or an array of strings', shown USING ERRCODE = '22023',
            DETAIL = format('Element %s of its array is %s.', element.n, idempotency.json_kind(element.value)), HINT = hint;
        END IF;
        IF (element.value #>> '{}') ~ '[\x01-\x08\x0a-\x1f\x7f]' THEN
          RAISE EXCEPTION 'response header % has a control character', shown USING ERRCODE = '22023',
            DETAIL = format('Element %s of its array holds a control character other than horizontal tab, which no HTTP field value may hold.', element.n),
            HINT = hint;
        END IF;
      END LOOP;
    ELSE
      RAISE EXCEPTION 'response header % must be a string or an array of strings', shown USING ERRCODE = '22023',
        DETAIL = format('Its value is %s.', idempotency.json_kind(item.value)), HINT = hint;
    END IF;
  END LOOP;
END
$$;
COMMENT ON FUNCTION idempotency.check_headers(jsonb) IS
  'Internal: refuses (22023) response headers that are not an object of HTTP field names and string values.';

-- The size of a jsonb value as the C++ edition counts it: uncompressed, with a 4-byte header
-- (a value read from a table may be compressed or carry a 1-byte header: it is built again).
CREATE OR REPLACE FUNCTION idempotency.jsonb_raw_size(value pg_catalog.jsonb) RETURNS pg_catalog.int8
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
  RETURN CASE WHEN value IS NULL THEN 0
              WHEN pg_column_size(value) <= 127 OR pg_column_compression(value) IS NOT NULL
                THEN pg_column_size(value::text::jsonb)
              ELSE pg_column_size(value) END;
END
$$;
COMMENT ON FUNCTION idempotency.jsonb_raw_size(jsonb) IS
  'Internal: bytes of a jsonb value uncompressed, with a 4-byte header (what max_response_size counts).';

CREATE OR REPLACE FUNCTION idempotency.complete_key_checked(
  key              pg_catalog.text,
  token            pg_catalog.uuid,
  response         pg_catalog.jsonb,
  response_code    pg_catalog.int4  DEFAULT NULL,
  scope            pg_catalog.text  DEFAULT '',
  response_body    pg_catalog.bytea    DEFAULT NULL,
  response_headers pg_catalog.jsonb    DEFAULT NULL,
  response_ttl     pg_catalog.interval DEFAULT NULL)
RETURNS idempotency.claim_result
LANGUAGE plpgsql VOLATILE SECURITY INVOKER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
  me text := current_user;
  keep interval;
  longest int8;
  k text := complete_key_checked.key;
  sc text := complete_key_checked.scope;
  tok uuid := complete_key_checked.token;
  resp jsonb := complete_key_checked.response;
  code int4 := complete_key_checked.response_code;
  body bytea := complete_key_checked.response_body;
  headers jsonb := complete_key_checked.response_headers;
  kept boolean;
  size_response int8;
  size_body int8;
  size_headers int8;
  limit_bytes int8;
  now_ts timestamptz;
  r idempotency.idempotency_keys;
  me_oid oid;
  here int8;
BEGIN
  IF NOT pg_catalog.has_schema_privilege('idempotency', 'USAGE') THEN
    RAISE EXCEPTION 'permission denied for schema idempotency' USING ERRCODE = '42501',
      DETAIL = 'Calls reached by OID (a BEGIN ATOMIC body, a view, a kept plan) are checked too.';
  END IF;
  -- The usual call (no setting of this edition set, key and scope within the default limit, a
  -- token, no headers, no response_ttl, a response and body within the default size even
  -- counted as the helpers count them) is checked in one expression, as claim_key's usual
  -- call is (1.3.2): jsonb_raw_size rebuilds a small value to count its 4-byte header, and an
  -- uncompressed value counts at most 4 bytes more than pg_column_size says. Any other call
  -- goes through the helpers, which say what is wrong (the same SQLSTATEs).
  IF (k <> '' AND octet_length(k) <= 255 AND octet_length(sc) <= 255 AND tok IS NOT NULL
      AND headers IS NULL AND complete_key_checked.response_ttl IS NULL
      AND pg_column_compression(complete_key_checked.response) IS NULL
      AND coalesce(pg_column_size(complete_key_checked.response)::int8 + 4, 0)
          + coalesce(octet_length(complete_key_checked.response_body)::int8 + 4, 0) <= 1048576
      AND concat(current_setting('idempotency.max_key_length', true),
                 current_setting('idempotency.max_response_size', true)) = '') IS NOT TRUE THEN
    PERFORM idempotency.check_name(k, sc);
    PERFORM idempotency.check_token(tok);
    size_response := idempotency.jsonb_raw_size(complete_key_checked.response);
    size_body := coalesce(octet_length(complete_key_checked.response_body) + 4, 0);
    size_headers := idempotency.jsonb_raw_size(complete_key_checked.response_headers);
    limit_bytes := idempotency.setting_value('max_response_size', 1048576, 1, 536870911, 'B');
    IF size_response + size_body + size_headers > limit_bytes THEN
      RAISE EXCEPTION 'response is too large' USING ERRCODE = '54000',
        DETAIL = format('The response has %s bytes (response %s, response_body %s, response_headers %s); idempotency.max_response_size is %s.',
                        size_response + size_body + size_headers, size_response, size_body, size_headers, limit_bytes);
    END IF;
    IF headers IS NOT NULL THEN
      PERFORM idempotency.check_headers(headers);
    END IF;
    -- The response's own time (a tombstone after it): positive, at most idempotency.max_ttl.
    IF complete_key_checked.response_ttl IS NOT NULL THEN
      keep := idempotency.as_span(complete_key_checked.response_ttl, 'response_ttl');
      IF keep <= interval '0' THEN
        RAISE EXCEPTION 'response_ttl must be positive' USING ERRCODE = '22023',
          HINT = 'Pass NULL to keep the response as long as the key.';
      END IF;
      longest := idempotency.setting_value('max_ttl', 2592000, 1, 2147483647, 's');
      IF keep > longest * interval '1 second' THEN
        RAISE EXCEPTION 'response_ttl exceeds idempotency.max_ttl' USING ERRCODE = '22023',
          DETAIL = format('idempotency.max_ttl is %s s.', longest);
      END IF;
    END IF;
  END IF;
  me_oid := quote_ident(me)::regrole::oid;
  here := idempotency.system_identifier();
  now_ts := clock_timestamp();
  UPDATE idempotency.idempotency_keys t
     SET status = 'completed', response_code = code, updated_at = now_ts, response = resp,
         expires_at = now_ts + t.ttl, response_body = body, response_headers = headers,
         -- A response kept shorter than the key gets its own end; else it lives as the key.
         response_expires_at = CASE WHEN now_ts + keep < now_ts + t.ttl THEN now_ts + keep END,
         owner_oid = me_oid, owner_system = here
   WHERE t.key = k AND t.scope = sc AND t.lease_token = tok AND t.owner = me
     AND t.status = 'processing' AND t.expires_at > now_ts AND (t.owner_oid IS NULL OR t.owner_system IS NULL OR t.owner_oid = me_oid OR t.owner_system <> here)
  RETURNING * INTO r;
  IF NOT FOUND THEN
    r := idempotency.explain_fence(k, sc, tok);
    IF r.response_code IS DISTINCT FROM code
       OR r.response_body IS DISTINCT FROM body
       OR r.response IS DISTINCT FROM resp
       OR r.response_headers IS DISTINCT FROM headers THEN
      RAISE EXCEPTION 'idempotency key % was already completed with another response',
        format('"%s"', k) || CASE WHEN sc = '' THEN '' ELSE format(' in scope "%s"', sc) END
        USING ERRCODE = '55000';
    END IF;
  END IF;
  -- stored_answer('replay', r), written out (1.3.2): a PL/pgSQL function's call is set up again
  -- in every transaction, and a completion is often its transaction's last call.
  kept := r.response_expires_at IS NULL OR r.response_expires_at > clock_timestamp();
  RETURN ROW('replay', NULL, CASE WHEN kept THEN r.response END, r.response_code, r.fingerprint,
             r.recovery_point, r.attempts, r.created_at, r.expires_at, NULL,
             CASE WHEN kept THEN r.response_body END, CASE WHEN kept THEN r.response_headers END,
             NOT kept)::idempotency.claim_result;
END
$$;
COMMENT ON FUNCTION idempotency.complete_key_checked(text, uuid, jsonb, integer, text, bytea, jsonb, interval) IS
  'Internal: complete_key of any call, with every argument checked by the helpers under a pinned '
  'search_path (complete_key answers the usual call itself).';

-- complete_key pins no search_path (1.3.2): entering and leaving a function with SET costs a
-- claim + complete transaction about 20 µs of CPU on PostgreSQL 15 (the path is switched and
-- computed again on each entry and exit, and complete_key follows claim_key's own switch).
-- So every name below is schema-qualified, operators and casts included, and nothing resolves
-- through the caller's path; the usual call (as claim_key's: no setting of this edition set,
-- key and scope within the default limit, a token, no headers, no response_ttl, a response
-- and body under the default size even counted as the helpers count them: an uncompressed
-- value counts at most 4 bytes more than pg_column_size) is completed here, and any other
-- call, or one that completes no row here, goes to complete_key_checked, which pins the path,
-- checks every argument with the helpers and says why nothing matched.
CREATE OR REPLACE FUNCTION idempotency.complete_key(
  key              pg_catalog.text,
  token            pg_catalog.uuid,
  response         pg_catalog.jsonb,
  response_code    pg_catalog.int4  DEFAULT NULL,
  scope            pg_catalog.text  DEFAULT '',
  response_body    pg_catalog.bytea    DEFAULT NULL,
  response_headers pg_catalog.jsonb    DEFAULT NULL,
  response_ttl     pg_catalog.interval DEFAULT NULL)
RETURNS idempotency.claim_result
LANGUAGE plpgsql VOLATILE SECURITY INVOKER PARALLEL UNSAFE
AS $$
#variable_conflict use_column
DECLARE
  me_oid pg_catalog.oid;
  now_ts pg_catalog.timestamptz;
  done idempotency.claim_result;  -- the answer, filled by the update's RETURNING
BEGIN
  IF NOT pg_catalog.has_schema_privilege('idempotency', 'USAGE') THEN
    RAISE EXCEPTION 'permission denied for schema idempotency' USING ERRCODE = '42501',
      DETAIL = 'Calls reached by OID (a BEGIN ATOMIC body, a view, a kept plan) are checked too.';
  END IF;
  IF (complete_key.key OPERATOR(pg_catalog.<>) ''
      AND pg_catalog.octet_length(complete_key.key) OPERATOR(pg_catalog.<=) 255
      AND pg_catalog.octet_length(complete_key.scope) OPERATOR(pg_catalog.<=) 255
      AND complete_key.token IS NOT NULL
      AND complete_key.response_headers IS NULL AND complete_key.response_ttl IS NULL
      AND pg_catalog.pg_column_compression(complete_key.response) IS NULL
      -- Each of response and body under half the default size (as counted, 4 bytes more than
      -- pg_column_size at most; GREATEST skips a NULL): their sum is then under the default
      -- size. Fewer functions than the sum itself (1.3.3: each function of a PL/pgSQL
      -- expression is looked up and its EXECUTE privilege checked again in every transaction);
      -- a larger one goes to complete_key_checked, which counts exactly.
      AND GREATEST(pg_catalog.pg_column_size(complete_key.response), pg_catalog.octet_length(complete_key.response_body), 0)
          OPERATOR(pg_catalog.<=) 524284
      AND pg_catalog.concat(pg_catalog.current_setting('idempotency.max_key_length', true),
                            pg_catalog.current_setting('idempotency.max_response_size', true))
          OPERATOR(pg_catalog.=) '') IS TRUE THEN
    me_oid := pg_catalog.quote_ident(CURRENT_USER)::pg_catalog.regrole::pg_catalog.oid;
    now_ts := pg_catalog.clock_timestamp();
    UPDATE idempotency.idempotency_keys t
       SET status = 'completed', response_code = complete_key.response_code, updated_at = now_ts,
           response = complete_key.response, expires_at = now_ts OPERATOR(pg_catalog.+) t.ttl,
           response_body = complete_key.response_body, response_headers = NULL,
           response_expires_at = NULL, owner_oid = me_oid, owner_system = idempotency.system_identifier()
     WHERE t.key OPERATOR(pg_catalog.=) complete_key.key AND t.scope OPERATOR(pg_catalog.=) complete_key.scope
       AND t.lease_token OPERATOR(pg_catalog.=) complete_key.token
       AND t.owner OPERATOR(pg_catalog.=) CURRENT_USER::pg_catalog.text  -- as the policy writes it (claim_key)
       AND t.status OPERATOR(pg_catalog.=) 'processing' AND t.expires_at OPERATOR(pg_catalog.>) now_ts
       AND (t.owner_oid IS NULL OR t.owner_system IS NULL OR t.owner_oid OPERATOR(pg_catalog.=) me_oid
            OR t.owner_system OPERATOR(pg_catalog.<>) idempotency.system_identifier())
    -- stored_answer('replay', r): the response was just stored, for as long as the key (no
    -- headers on this path). Only the answer's fields are returned, into the answer itself
    -- (1.3.3: no row of every column, no second row built from it).
    RETURNING 'replay', t.response, t.response_code, t.fingerprint, t.recovery_point, t.attempts,
              t.created_at, t.expires_at, t.response_body, false
         INTO done.status, done.response, done.response_code, done.fingerprint, done.recovery_point,
              done.attempts, done.created_at, done.expires_at, done.response_body, done.response_dropped;
    IF FOUND THEN
      RETURN done;
    END IF;
  END IF;
  RETURN idempotency.complete_key_checked(complete_key.key, complete_key.token, complete_key.response,
                                          complete_key.response_code, complete_key.scope,
                                          complete_key.response_body, complete_key.response_headers,
                                          complete_key.response_ttl);
END
$$;
COMMENT ON FUNCTION idempotency.complete_key(text, uuid, jsonb, integer, text, bytea, jsonb, interval) IS
  'Stores the outcome of a claim held with `token`: a jsonb response and code, and optionally '
  'the response as sent (body bytes and headers, replayed byte for byte); duplicates then get '
  'replay. response_ttl: the response is dropped that long after the completion while the key '
  'stays until its ttl (replay with response_dropped, mismatch still detected); NULL keeps it '
  'as long as the key; 22023 when not positive or over idempotency.max_ttl. Fenced: a token '
  'that no longer holds the key is rejected (55000).';

CREATE OR REPLACE FUNCTION idempotency.release_key(key pg_catalog.text, token pg_catalog.uuid,
                                                   scope pg_catalog.text DEFAULT '')
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
  k text := release_key.key;
  sc text := release_key.scope;
  tok uuid := release_key.token;
  now_ts timestamptz;
  me_oid oid;
  here int8;
BEGIN
  IF NOT pg_catalog.has_schema_privilege('idempotency', 'USAGE') THEN
    RAISE EXCEPTION 'permission denied for schema idempotency' USING ERRCODE = '42501',
      DETAIL = 'Calls reached by OID (a BEGIN ATOMIC body, a view, a kept plan) are checked too.';
  END IF;
  PERFORM idempotency.check_name(k, sc);
  PERFORM idempotency.check_token(tok);
  me_oid := quote_ident(current_user)::regrole::oid;
  here := idempotency.system_identifier();
  now_ts := clock_timestamp();
  UPDATE idempotency.idempotency_keys t
     SET lease_token = NULL, locked_until = NULL, updated_at = now_ts, owner_oid = me_oid, owner_system = here
   WHERE t.key = k AND t.scope = sc AND t.lease_token = tok AND t.owner = current_user
     AND t.status = 'processing' AND t.expires_at > now_ts AND (t.owner_oid IS NULL OR t.owner_system IS NULL OR t.owner_oid = me_oid OR t.owner_system <> here);
  IF NOT FOUND THEN
    PERFORM idempotency.explain_fence(k, sc, tok);
    RAISE EXCEPTION 'idempotency key % is completed and cannot be released',
      format('"%s"', k) || CASE WHEN sc = '' THEN '' ELSE format(' in scope "%s"', sc) END
      USING ERRCODE = '55000';
  END IF;
END
$$;
COMMENT ON FUNCTION idempotency.release_key(text, uuid, text) IS
  'Gives a claim up without an outcome (a transient failure): the next claim_key gets '
  'reclaimed at once. Fenced like complete_key.';

CREATE OR REPLACE FUNCTION idempotency.checkpoint_key(
  key            pg_catalog.text,
  token          pg_catalog.uuid,
  recovery_point pg_catalog.text,
  scope          pg_catalog.text     DEFAULT '',
  lease          pg_catalog.interval DEFAULT NULL)
RETURNS pg_catalog.timestamptz
LANGUAGE plpgsql VOLATILE SECURITY INVOKER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
  k text := checkpoint_key.key;
  sc text := checkpoint_key.scope;
  tok uuid := checkpoint_key.token;
  point text := checkpoint_key.recovery_point;
  v_lease interval;
  now_ts timestamptz;
  until timestamptz;
  me_oid oid;
  here int8;
BEGIN
  IF NOT pg_catalog.has_schema_privilege('idempotency', 'USAGE') THEN
    RAISE EXCEPTION 'permission denied for schema idempotency' USING ERRCODE = '42501',
      DETAIL = 'Calls reached by OID (a BEGIN ATOMIC body, a view, a kept plan) are checked too.';
  END IF;
  PERFORM idempotency.check_name(k, sc);
  PERFORM idempotency.check_token(tok);
  IF point IS NOT NULL THEN
    PERFORM idempotency.check_size(octet_length(point), 'recovery point', 'max_recovery_point_size', 1024, 1048576);
  END IF;
  IF checkpoint_key.lease IS NOT NULL THEN
    v_lease := idempotency.checked_interval(checkpoint_key.lease, 'lease');
  END IF;
  me_oid := quote_ident(current_user)::regrole::oid;
  here := idempotency.system_identifier();
  now_ts := clock_timestamp();
  IF v_lease IS NULL THEN
    SELECT t.lease INTO v_lease FROM idempotency.idempotency_keys t
     WHERE t.key = k AND t.scope = sc AND t.owner = current_user AND t.expires_at > now_ts AND (t.owner_oid IS NULL OR t.owner_system IS NULL OR t.owner_oid = me_oid OR t.owner_system <> here);
    IF NOT FOUND THEN
      PERFORM idempotency.explain_fence(k, sc, tok);
    END IF;
  END IF;
  until := now_ts + v_lease;
  UPDATE idempotency.idempotency_keys t
     SET recovery_point = point, locked_until = until, expires_at = greatest(t.expires_at, until),
         updated_at = now_ts, owner_oid = me_oid, owner_system = here
   WHERE t.key = k AND t.scope = sc AND t.lease_token = tok AND t.owner = current_user
     AND t.status = 'processing' AND t.expires_at > now_ts AND (t.owner_oid IS NULL OR t.owner_system IS NULL OR t.owner_oid = me_oid OR t.owner_system <> here);
  IF NOT FOUND THEN
    PERFORM idempotency.explain_fence(k, sc, tok);
    RAISE EXCEPTION 'idempotency key % is completed; there is nothing to checkpoint',
      format('"%s"', k) || CASE WHEN sc = '' THEN '' ELSE format(' in scope "%s"', sc) END
      USING ERRCODE = '55000';
  END IF;
  RETURN until;
END
$$;
COMMENT ON FUNCTION idempotency.checkpoint_key(text, uuid, text, text, interval) IS
  'Records the progress of a multi-step handler and renews the lease (a heartbeat); '
  'returns the new end of the lease. Fenced like complete_key.';

-------------------------------------------------------------------------------
-- The key's life cycle (1.3.1; the C++ edition's 1.3, issue #37): look, forget, the policy
-------------------------------------------------------------------------------

-- Whether another transaction, still open, writes the caller's (scope, key): a claim writing
-- the key (a new one, or a take-over) holds the key's lock until its transaction ends, and a
-- transaction that updated, deleted or locked the row version seen (`writer`, its xmax: a
-- completion, a release, a forget, the cleanup) holds the lock of its own transaction id.
-- Read from pg_locks, so that the question takes no lock at all: a lock taken even for a
-- moment would make a concurrent claim with wait 0 answer in_progress. The tag is
-- key_lock_tag's; without a committed secret the role has no claim whose key lock could be
-- found (its very first claim, still open, is the one case this cannot see: that claim's
-- secret is not committed yet).
CREATE OR REPLACE FUNCTION idempotency.claimed_elsewhere(scope pg_catalog.text, key pg_catalog.text,
                                                         writer pg_catalog.xid)
RETURNS pg_catalog.bool
LANGUAGE plpgsql VOLATILE SECURITY INVOKER PARALLEL UNSAFE
AS $$
#variable_conflict use_variable
DECLARE
  me text := current_user;
  role_secret bytea;
  tag int8;
BEGIN
  SELECT s.secret INTO role_secret FROM idempotency.role_secrets s WHERE s.owner = me;
  IF FOUND THEN
    tag := ('x' || encode(substr(sha256(role_secret || convert_to(me, 'UTF8') || '\x00'::bytea
                                        || convert_to(scope, 'UTF8') || '\x00'::bytea
                                        || convert_to(key, 'UTF8')), 1, 8), 'hex'))::bit(64)::int8;
  END IF;
  IF writer = '0'::xid THEN
    writer := NULL;  -- a version nobody updated, deleted or locked
  END IF;
  IF tag IS NULL AND writer IS NULL THEN
    RETURN false;
  END IF;
  -- An advisory lock on a bigint: classid the high 32 bits, objid the low, objsubid 1.
  RETURN EXISTS (SELECT FROM pg_locks l
                  WHERE l.granted AND l.pid IS DISTINCT FROM pg_backend_pid()
                    AND ((l.locktype = 'advisory' AND l.objsubid = 1
                          AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
                          AND l.classid = ((tag >> 32) & 4294967295)::oid
                          AND l.objid = (tag & 4294967295)::oid)
                         OR (l.locktype = 'transactionid' AND l.transactionid = writer)));
END
$$;
COMMENT ON FUNCTION idempotency.claimed_elsewhere(text, text, xid) IS
  'Internal: whether another open transaction holds the key lock of the caller''s (scope, key), '
  'or is the writer (xmax) of the row version seen, read from pg_locks without taking a lock.';

-- Look: what claim_key would answer now, deciding nothing: one read of the caller's row (as of
-- the statement's snapshot) and of pg_locks; no write, no lock, no wait. claimed / reclaimed
-- come without a token (nothing was claimed); reclaimed carries the attempts so far and the
-- recovery point the claim would resume from.
CREATE OR REPLACE FUNCTION idempotency.look_key(
  key         pg_catalog.text,
  fingerprint pg_catalog.bytea DEFAULT NULL,
  scope       pg_catalog.text  DEFAULT '')
RETURNS idempotency.claim_result
LANGUAGE plpgsql VOLATILE SECURITY INVOKER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
  me text := current_user;
  k text := look_key.key;
  sc text := look_key.scope;
  fp bytea := look_key.fingerprint;
  now_ts timestamptz;
  r idempotency.idempotency_keys;
  seen record;
  writer xid;
  answer idempotency.claim_result;
  me_oid oid;
  here int8;
BEGIN
  IF NOT pg_catalog.has_schema_privilege('idempotency', 'USAGE') THEN
    RAISE EXCEPTION 'permission denied for schema idempotency' USING ERRCODE = '42501',
      DETAIL = 'Calls reached by OID (a BEGIN ATOMIC body, a view, a kept plan) are checked too.';
  END IF;
  PERFORM idempotency.check_name(k, sc);
  IF fp IS NOT NULL THEN
    PERFORM idempotency.check_size(octet_length(fp), 'fingerprint', 'max_fingerprint_size', 64, 1024);
  END IF;
  me_oid := quote_ident(me)::regrole::oid;
  here := idempotency.system_identifier();
  now_ts := clock_timestamp();
  -- A row of the caller's name stamped here by another role (an earlier role of this name) is
  -- absent for the caller, as for claim_key.
  -- The row, and the transaction that updated, deleted or locked this version (xmax), if any.
  SELECT t AS row_seen, t.xmax AS row_writer INTO seen FROM idempotency.idempotency_keys t
   WHERE t.key = k AND t.scope = sc AND t.owner = me
     AND (t.owner_oid IS NULL OR t.owner_system IS NULL OR t.owner_oid = me_oid OR t.owner_system <> here);
  IF FOUND THEN
    r := seen.row_seen;
    writer := seen.row_writer;
  END IF;
  IF r.key IS NOT NULL AND r.expires_at > now_ts THEN
    IF fp IS NOT NULL AND r.fingerprint IS NOT NULL AND r.fingerprint <> fp THEN
      RETURN idempotency.stored_answer('mismatch', r);
    END IF;
    IF r.status = 'completed' THEN
      RETURN idempotency.stored_answer('replay', r);
    END IF;
    IF r.lease_token IS NOT NULL AND r.locked_until > now_ts THEN
      -- The caller's own claim: what it was claimed with, and when its lease ends.
      answer := idempotency.stored_answer('in_progress', r);
      answer.retry_after := greatest(r.locked_until - now_ts, interval '1 millisecond');
      RETURN answer;
    END IF;
    -- Released, or its lease ended: a claim would make attempt attempts + 1 from recovery_point,
    -- unless another open transaction takes it over, completes, releases or forgets it.
    IF NOT idempotency.claimed_elsewhere(sc, k, writer) THEN
      answer := idempotency.stored_answer('reclaimed', r);
      answer.recovery_point := r.recovery_point;
      RETURN answer;
    END IF;
  ELSIF NOT idempotency.claimed_elsewhere(sc, k, writer) THEN
    -- Absent or expired: a claim would take it; nothing of an old row is shown.
    RETURN ROW('claimed', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::idempotency.claim_result;
  END IF;
  -- Another open transaction writes the key (a claim's lease not visible yet): as claim_key
  -- with wait 0 would answer.
  RETURN ROW('in_progress', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
             interval '1 second', NULL, NULL, NULL)::idempotency.claim_result;
END
$$;
COMMENT ON FUNCTION idempotency.look_key(text, bytea, text) IS
  'What claim_key(key, fingerprint, scope) would answer now, without claiming, writing, keeping '
  'a lock or waiting: replay (with the response), mismatch, in_progress (also at once for a '
  'key another open transaction is claiming), or claimed / reclaimed with a NULL token (a claim '
  'would take the key). Only the caller''s own keys: another role''s key does not exist for it. '
  'Errors as claim_key: 22004 NULL key or scope, 22023 empty key, 22001 key or fingerprint over '
  'its limit, 42501 without USAGE on the schema.';

-- Forget: a role deletes its own key, so that the operation can run again (the next claim_key
-- answers claimed). Absent is no error (false), as a DELETE of no row is none: a retried
-- forget_key succeeds. The row is locked with SKIP LOCKED: a key another open transaction
-- writes (a claim, a completion, a forget) is refused at once, never waited for.
CREATE OR REPLACE FUNCTION idempotency.forget_key(
  key   pg_catalog.text,
  token pg_catalog.uuid DEFAULT NULL,
  scope pg_catalog.text DEFAULT '')
RETURNS pg_catalog.bool
LANGUAGE plpgsql VOLATILE SECURITY INVOKER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
  me text := current_user;
  k text := forget_key.key;
  sc text := forget_key.scope;
  tok uuid := forget_key.token;
  described text;
  now_ts timestamptz;
  r idempotency.idempotency_keys;
  expired boolean;
BEGIN
  IF NOT pg_catalog.has_schema_privilege('idempotency', 'USAGE') THEN
    RAISE EXCEPTION 'permission denied for schema idempotency' USING ERRCODE = '42501',
      DETAIL = 'Calls reached by OID (a BEGIN ATOMIC body, a view, a kept plan) are checked too.';
  END IF;
  PERFORM idempotency.check_name(k, sc);
  described := format('"%s"', k) || CASE WHEN sc = '' THEN '' ELSE format(' in scope "%s"', sc) END;
  now_ts := clock_timestamp();
  SELECT * INTO r FROM idempotency.idempotency_keys t
   WHERE t.key = k AND t.scope = sc AND t.owner = me
     FOR UPDATE SKIP LOCKED;
  IF NOT FOUND THEN
    -- None, or one another open transaction holds: its row locked, or a new claim's key lock.
    IF NOT EXISTS (SELECT FROM idempotency.idempotency_keys t WHERE t.key = k AND t.scope = sc AND t.owner = me)
       AND NOT idempotency.claimed_elsewhere(sc, k, NULL) THEN
      RETURN false;
    END IF;
    RAISE EXCEPTION 'idempotency key % is in progress', described USING ERRCODE = '55000',
      DETAIL = 'Another transaction that is still open claims, completes or forgets it.',
      HINT = 'Try again when that transaction has ended.';
  END IF;
  -- A row of an earlier role of the caller's name is no key of the caller's.
  IF r.owner_oid IS NOT NULL AND r.owner_system IS NOT NULL
     AND r.owner_oid <> quote_ident(me)::regrole::oid
     AND r.owner_system = idempotency.system_identifier() THEN
    RETURN false;
  END IF;
  expired := r.expires_at <= now_ts;
  IF tok IS NOT NULL AND NOT expired AND r.lease_token IS DISTINCT FROM tok THEN
    RAISE EXCEPTION 'token does not hold idempotency key %', described USING ERRCODE = '55000',
      DETAIL = CASE WHEN r.lease_token IS NULL THEN 'The key was released.'
                    ELSE 'The key was claimed with another token.' END,
      HINT = 'Forget it without a token, or pass the token that claim_key returned for it.';
  END IF;
  IF tok IS NULL AND NOT expired AND r.status = 'processing' AND r.lease_token IS NOT NULL
     AND r.locked_until > now_ts THEN
    RAISE EXCEPTION 'idempotency key % is held by a live claim', described USING ERRCODE = '55000',
      DETAIL = format('The claim''s lease ends at %s.', r.locked_until),
      HINT = 'Pass the claim''s token to forget it, or release or complete it first.';
  END IF;
  DELETE FROM idempotency.idempotency_keys t WHERE t.key = k AND t.scope = sc AND t.owner = me;
  RETURN FOUND;
END
$$;
COMMENT ON FUNCTION idempotency.forget_key(text, uuid, text) IS
  'Deletes the caller''s own key (scope, key): completed, released, expired, or with an ended '
  'lease; returns false when the caller has no such key. A key held by a live claim is refused '
  '(55000) unless token is its holder''s; a token given must be the key''s (55000 otherwise). A '
  'key that another open transaction claims, completes or forgets is refused at once (55000), '
  'never waited for. A holder whose key was forgotten gets P0002 from complete_key. Other '
  'errors as claim_key.';

-- The policy: what an API publishes about its keys (the IETF draft on the Idempotency-Key
-- header asks resources to say how long keys are kept): the values claim_key applies in this
-- session, read as it reads them (22023 for a bad setting, as at a claim).
CREATE OR REPLACE FUNCTION idempotency.key_policy(
  OUT default_ttl       pg_catalog.interval,
  OUT max_ttl           pg_catalog.interval,
  OUT default_lease     pg_catalog.interval,
  OUT max_lease         pg_catalog.interval,
  OUT max_key_length    pg_catalog.int4,
  OUT max_response_size pg_catalog.int4)
RETURNS record
LANGUAGE plpgsql STABLE SECURITY INVOKER PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF NOT pg_catalog.has_schema_privilege('idempotency', 'USAGE') THEN
    RAISE EXCEPTION 'permission denied for schema idempotency' USING ERRCODE = '42501',
      DETAIL = 'Calls reached by OID (a BEGIN ATOMIC body, a view, a kept plan) are checked too.';
  END IF;
  default_ttl := idempotency.checked_interval(NULL, 'ttl');
  max_ttl := idempotency.setting_value('max_ttl', 2592000, 1, 2147483647, 's') * interval '1 second';
  default_lease := idempotency.checked_interval(NULL, 'lease');
  max_lease := idempotency.setting_value('max_lease', 86400, 1, 2147483647, 's') * interval '1 second';
  max_key_length := idempotency.setting_value('max_key_length', 255, 1, 1024, '');
  max_response_size := idempotency.setting_value('max_response_size', 1048576, 1, 536870911, 'B');
END
$$;
COMMENT ON FUNCTION idempotency.key_policy() IS
  'The key policy in force for this session, from the settings idempotency.default_ttl, '
  'max_ttl, default_lease, max_lease, max_key_length and max_response_size: how long a key is '
  'kept by default (a completed key: ttl after its completion) and at most, the lease of a '
  'claim, and the largest key and response accepted. For an API to publish; changes nothing.';

-------------------------------------------------------------------------------
-- Batches
-------------------------------------------------------------------------------

-- A one-dimensional array argument whose length, when given, is that of keys (2202E).
CREATE OR REPLACE FUNCTION idempotency.check_array(dims pg_catalog.int4, elements pg_catalog.int4,
                                                   name pg_catalog.text, expected pg_catalog.int4)
RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
  IF dims > 1 THEN
    RAISE EXCEPTION '% must be a one-dimensional array', name USING ERRCODE = '2202E',
      DETAIL = format('%s has %s dimensions.', name, dims);
  END IF;
  IF expected IS NOT NULL AND coalesce(elements, 0) <> expected THEN
    RAISE EXCEPTION '% and keys differ in length', name USING ERRCODE = '2202E',
      DETAIL = format('%s has %s elements; keys has %s.', name, coalesce(elements, 0), expected),
      HINT = 'Pass one element per key, or NULL for none.';
  END IF;
END
$$;
COMMENT ON FUNCTION idempotency.check_array(integer, integer, text, integer) IS
  'Internal: refuses (2202E) a multi-dimensional array or one of another length than keys.';

CREATE OR REPLACE FUNCTION idempotency.claim_keys(
  keys                 pg_catalog.text[],
  fingerprints         pg_catalog.bytea[]  DEFAULT NULL,
  scope                pg_catalog.text     DEFAULT '',
  ttl                  pg_catalog.interval DEFAULT NULL,
  lease                pg_catalog.interval DEFAULT NULL,
  OUT ordinality       pg_catalog.int4,
  OUT key              pg_catalog.text,
  OUT status           idempotency.claim_status,
  OUT token            pg_catalog.uuid,
  OUT response         pg_catalog.jsonb,
  OUT response_code    pg_catalog.int4,
  OUT fingerprint      pg_catalog.bytea,
  OUT recovery_point   pg_catalog.text,
  OUT attempts         pg_catalog.int4,
  OUT created_at       pg_catalog.timestamptz,
  OUT expires_at       pg_catalog.timestamptz,
  OUT retry_after      pg_catalog.interval,
  OUT response_body    pg_catalog.bytea,
  OUT response_headers pg_catalog.jsonb)
RETURNS SETOF record
LANGUAGE plpgsql VOLATILE SECURITY INVOKER PARALLEL UNSAFE ROWS 100
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
  n int4;
  i int4;
  answer idempotency.claim_result;
  sc text := claim_keys.scope;
BEGIN
  IF NOT pg_catalog.has_schema_privilege('idempotency', 'USAGE') THEN
    RAISE EXCEPTION 'permission denied for schema idempotency' USING ERRCODE = '42501',
      DETAIL = 'Calls reached by OID (a BEGIN ATOMIC body, a view, a kept plan) are checked too.';
  END IF;
  IF keys IS NULL THEN
    RAISE EXCEPTION 'keys must not be null' USING ERRCODE = '22004',
      HINT = 'Pass an array of keys; an empty array gives no rows.';
  END IF;
  PERFORM idempotency.check_array(array_ndims(keys), cardinality(keys), 'keys', NULL);
  n := cardinality(keys);
  IF fingerprints IS NOT NULL THEN
    PERFORM idempotency.check_array(array_ndims(fingerprints), cardinality(fingerprints), 'fingerprints', n);
  END IF;
  IF sc IS NULL THEN
    PERFORM idempotency.check_name('x', sc);
  END IF;
  FOR i IN 1 .. n LOOP
    BEGIN
      answer := idempotency.claim_key(keys[array_lower(keys, 1) + i - 1],
                                      fingerprints[array_lower(fingerprints, 1) + i - 1],
                                      sc, claim_keys.ttl, claim_keys.lease, interval '0');
    EXCEPTION WHEN OTHERS THEN
      DECLARE
        state text; message text; detail text; hint text;
      BEGIN
        GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, message = MESSAGE_TEXT,
                                detail = PG_EXCEPTION_DETAIL, hint = PG_EXCEPTION_HINT;
        RAISE EXCEPTION USING ERRCODE = state, MESSAGE = message,
          DETAIL = ltrim(coalesce(detail, '') || format(' At element %s of keys.', i)),
          HINT = coalesce(hint, '');
      END;
    END;
    ordinality := i;
    key := keys[array_lower(keys, 1) + i - 1];
    status := answer.status; token := answer.token; response := answer.response;
    response_code := answer.response_code; fingerprint := answer.fingerprint;
    recovery_point := answer.recovery_point; attempts := answer.attempts;
    created_at := answer.created_at; expires_at := answer.expires_at;
    retry_after := answer.retry_after; response_body := answer.response_body;
    response_headers := answer.response_headers;
    RETURN NEXT;
  END LOOP;
END
$$;
COMMENT ON FUNCTION idempotency.claim_keys(text[], bytea[], text, interval, interval) IS
  'Claims a batch of keys of one scope in the caller''s transaction: one row per key, in '
  'input order, as claim_key (wait 0) would answer each. fingerprints, when given, has one '
  'element per key. A repeated key: the first occurrence decides, later ones get in_progress '
  '(or replay / mismatch like the first). The portable edition keeps a lock per claimed key.';

CREATE OR REPLACE FUNCTION idempotency.complete_keys_each(
  keys                 pg_catalog.text[],
  tokens               pg_catalog.uuid[],
  responses            pg_catalog.jsonb[],
  response_codes       pg_catalog.int4[]  DEFAULT NULL,
  scope                pg_catalog.text    DEFAULT '',
  response_bodies      pg_catalog.bytea[] DEFAULT NULL,
  all_headers          pg_catalog.jsonb[] DEFAULT NULL,
  OUT ordinality       pg_catalog.int4,
  OUT key              pg_catalog.text,
  OUT status           idempotency.claim_status,
  OUT token            pg_catalog.uuid,
  OUT response         pg_catalog.jsonb,
  OUT response_code    pg_catalog.int4,
  OUT fingerprint      pg_catalog.bytea,
  OUT recovery_point   pg_catalog.text,
  OUT attempts         pg_catalog.int4,
  OUT created_at       pg_catalog.timestamptz,
  OUT expires_at       pg_catalog.timestamptz,
  OUT retry_after      pg_catalog.interval,
  OUT response_body    pg_catalog.bytea,
  OUT response_headers pg_catalog.jsonb)
RETURNS SETOF record
LANGUAGE plpgsql VOLATILE SECURITY INVOKER PARALLEL UNSAFE ROWS 100
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
  n int4;
  i int4;
  answer idempotency.claim_result;
  sc text := complete_keys_each.scope;
BEGIN
  IF NOT pg_catalog.has_schema_privilege('idempotency', 'USAGE') THEN
    RAISE EXCEPTION 'permission denied for schema idempotency' USING ERRCODE = '42501',
      DETAIL = 'Calls reached by OID (a BEGIN ATOMIC body, a view, a kept plan) are checked too.';
  END IF;
  IF keys IS NULL THEN
    RAISE EXCEPTION 'keys must not be null' USING ERRCODE = '22004',
      HINT = 'Pass an array of keys; an empty array gives no rows.';
  END IF;
  PERFORM idempotency.check_array(array_ndims(keys), cardinality(keys), 'keys', NULL);
  n := cardinality(keys);
  IF tokens IS NULL THEN
    RAISE EXCEPTION 'tokens must not be null' USING ERRCODE = '22004';
  END IF;
  PERFORM idempotency.check_array(array_ndims(tokens), cardinality(tokens), 'tokens', n);
  IF responses IS NOT NULL THEN
    PERFORM idempotency.check_array(array_ndims(responses), cardinality(responses), 'responses', n);
  END IF;
  IF response_codes IS NOT NULL THEN
    PERFORM idempotency.check_array(array_ndims(response_codes), cardinality(response_codes), 'response_codes', n);
  END IF;
  IF response_bodies IS NOT NULL THEN
    PERFORM idempotency.check_array(array_ndims(response_bodies), cardinality(response_bodies), 'response_bodies', n);
  END IF;
  IF all_headers IS NOT NULL THEN
    PERFORM idempotency.check_array(array_ndims(all_headers), cardinality(all_headers), 'response_headers', n);
  END IF;
  FOR i IN 1 .. n LOOP
    BEGIN
      answer := idempotency.complete_key(keys[array_lower(keys, 1) + i - 1],
                                         tokens[array_lower(tokens, 1) + i - 1],
                                         responses[array_lower(responses, 1) + i - 1],
                                         response_codes[array_lower(response_codes, 1) + i - 1],
                                         sc,
                                         response_bodies[array_lower(response_bodies, 1) + i - 1],
                                         all_headers[array_lower(all_headers, 1) + i - 1]);
    EXCEPTION WHEN OTHERS THEN
      DECLARE
        state text; message text; detail text; hint text;
      BEGIN
        GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, message = MESSAGE_TEXT,
                                detail = PG_EXCEPTION_DETAIL, hint = PG_EXCEPTION_HINT;
        RAISE EXCEPTION USING ERRCODE = state, MESSAGE = message,
          DETAIL = ltrim(coalesce(detail, '') || format(' At element %s of keys.', i)),
          HINT = coalesce(hint, '');
      END;
    END;
    ordinality := i;
    key := keys[array_lower(keys, 1) + i - 1];
    status := answer.status; token := answer.token; response := answer.response;
    response_code := answer.response_code; fingerprint := answer.fingerprint;
    recovery_point := answer.recovery_point; attempts := answer.attempts;
    created_at := answer.created_at; expires_at := answer.expires_at;
    retry_after := answer.retry_after; response_body := answer.response_body;
    response_headers := answer.response_headers;
    RETURN NEXT;
  END LOOP;
END
$$;
COMMENT ON FUNCTION idempotency.complete_keys_each(text[], uuid[], jsonb[], integer[], text, bytea[], jsonb[]) IS
  'Internal: the body of complete_keys (PL/pgSQL cannot name an argument and a result column alike).';

CREATE OR REPLACE FUNCTION idempotency.complete_keys(
  keys                 pg_catalog.text[],
  tokens               pg_catalog.uuid[],
  responses            pg_catalog.jsonb[],
  response_codes       pg_catalog.int4[]  DEFAULT NULL,
  scope                pg_catalog.text    DEFAULT '',
  response_bodies      pg_catalog.bytea[] DEFAULT NULL,
  response_headers     pg_catalog.jsonb[] DEFAULT NULL,
  OUT ordinality       pg_catalog.int4,
  OUT key              pg_catalog.text,
  OUT status           idempotency.claim_status,
  OUT token            pg_catalog.uuid,
  OUT response         pg_catalog.jsonb,
  OUT response_code    pg_catalog.int4,
  OUT fingerprint      pg_catalog.bytea,
  OUT recovery_point   pg_catalog.text,
  OUT attempts         pg_catalog.int4,
  OUT created_at       pg_catalog.timestamptz,
  OUT expires_at       pg_catalog.timestamptz,
  OUT retry_after      pg_catalog.interval,
  OUT response_body    pg_catalog.bytea,
  OUT response_headers pg_catalog.jsonb)
RETURNS SETOF record
LANGUAGE sql VOLATILE SECURITY INVOKER PARALLEL UNSAFE ROWS 100
SET search_path = pg_catalog, pg_temp
AS $$ SELECT * FROM idempotency.complete_keys_each($1, $2, $3, $4, $5, $6, $7) $$;
COMMENT ON FUNCTION idempotency.complete_keys(text[], uuid[], jsonb[], integer[], text, bytea[], jsonb[]) IS
  'Stores the outcomes of a batch of claims (element i: keys[i], tokens[i], responses[i], '
  'response_codes[i], response_bodies[i], response_headers[i]); one row per key, in input '
  'order, as complete_key answers. Fenced like complete_key: any refused element fails the '
  'whole call, which then changes nothing.';

-------------------------------------------------------------------------------
-- Cleanup without a worker
-------------------------------------------------------------------------------

-- One batch: expired keys, keys whose owner names no role (dropped or renamed), and keys
-- stamped in this cluster by a role that is not the role of their name now (an earlier role
-- of that name), locked with SKIP LOCKED so that no claim waits for it and it waits for no claim.
CREATE OR REPLACE FUNCTION idempotency.cleanup_batch(batch_size pg_catalog.int4)
RETURNS pg_catalog.int8
LANGUAGE sql VOLATILE SECURITY INVOKER PARALLEL UNSAFE
AS $$
  WITH here AS (SELECT system_identifier AS id FROM pg_catalog.pg_control_system()),
  doomed AS (
    SELECT t.ctid FROM idempotency.idempotency_keys t, here
     WHERE t.expires_at <= clock_timestamp()
        OR NOT EXISTS (SELECT FROM pg_catalog.pg_roles r
                        WHERE r.rolname = t.owner
                          AND (t.owner_oid IS NULL OR t.owner_system IS NULL
                               OR t.owner_system <> here.id OR r.oid = t.owner_oid))
     LIMIT batch_size
       FOR UPDATE OF t SKIP LOCKED),
  gone AS (
    DELETE FROM idempotency.idempotency_keys t USING doomed WHERE t.ctid = doomed.ctid RETURNING 1)
  SELECT count(*) FROM gone
$$;
COMMENT ON FUNCTION idempotency.cleanup_batch(integer) IS
  'Internal: deletes at most batch_size expired keys, keys of roles that no longer exist and keys '
  'stamped here by an earlier role of their name, skipping locked rows.';
REVOKE ALL ON FUNCTION idempotency.cleanup_batch(integer) FROM PUBLIC;

-- One batch of tombstones (1.3.1): keys whose response passed its response_expires_at and is
-- still stored lose the response's three columns; the key, its fingerprint, code and
-- response_expires_at stay, so that a replay still says the response was dropped. No index
-- leads to these rows (every claim would pay for one more index entry): the statement reads
-- the table until it has batch_size of them, or to its end, as cleanup_batch does.
CREATE OR REPLACE FUNCTION idempotency.drop_responses_batch(batch_size pg_catalog.int4)
RETURNS pg_catalog.int8
LANGUAGE sql VOLATILE SECURITY INVOKER PARALLEL UNSAFE
AS $$
  WITH due AS (
    SELECT t.ctid FROM idempotency.idempotency_keys t
     WHERE t.response_expires_at <= clock_timestamp()
       AND (t.response IS NOT NULL OR t.response_body IS NOT NULL OR t.response_headers IS NOT NULL)
     LIMIT batch_size
       FOR UPDATE OF t SKIP LOCKED),
  dropped AS (
    UPDATE idempotency.idempotency_keys t SET response = NULL, response_body = NULL, response_headers = NULL
      FROM due WHERE t.ctid = due.ctid RETURNING 1)
  SELECT count(*) FROM dropped
$$;
COMMENT ON FUNCTION idempotency.drop_responses_batch(integer) IS
  'Internal: drops the stored responses of at most batch_size keys past their response_expires_at '
  '(complete_key''s response_ttl), keeping the keys, skipping locked rows.';
REVOKE ALL ON FUNCTION idempotency.drop_responses_batch(integer) FROM PUBLIC;

-- One batch of adoptions: rows not stamped, or stamped in another cluster (restored,
-- replicated), whose name names a role, get that role's OID and this cluster's identifier;
-- from then on a role dropped and created again under the name cannot inherit them.
CREATE OR REPLACE FUNCTION idempotency.adopt_batch(batch_size pg_catalog.int4)
RETURNS pg_catalog.int8
LANGUAGE sql VOLATILE SECURITY INVOKER PARALLEL UNSAFE
AS $$
  WITH here AS (SELECT system_identifier AS id FROM pg_catalog.pg_control_system()),
  adopted AS (
    SELECT t.ctid, r.oid FROM idempotency.idempotency_keys t
      JOIN pg_catalog.pg_roles r ON r.rolname = t.owner, here
     WHERE t.owner_oid IS NULL OR t.owner_system IS NULL OR t.owner_system <> here.id
     LIMIT batch_size
       FOR UPDATE OF t SKIP LOCKED),
  stamped AS (
    UPDATE idempotency.idempotency_keys t SET owner_oid = adopted.oid, owner_system = here.id
      FROM adopted, here WHERE t.ctid = adopted.ctid RETURNING 1)
  SELECT count(*) FROM stamped
$$;
COMMENT ON FUNCTION idempotency.adopt_batch(integer) IS
  'Internal: stamps at most batch_size unstamped or foreign keys with the role of their name, skipping locked rows.';
REVOKE ALL ON FUNCTION idempotency.adopt_batch(integer) FROM PUBLIC;

CREATE OR REPLACE FUNCTION idempotency.idempotency_cleanup(batch_size pg_catalog.int4 DEFAULT NULL)
RETURNS pg_catalog.int8
LANGUAGE plpgsql VOLATILE SECURITY INVOKER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  size int4;
  deleted int8 := 0;
  batch int8;
BEGIN
  IF NOT pg_catalog.has_schema_privilege('idempotency', 'USAGE') THEN
    RAISE EXCEPTION 'permission denied for schema idempotency' USING ERRCODE = '42501';
  END IF;
  size := coalesce(batch_size, idempotency.setting_value('cleanup_batch_size', 5000, 1, 1000000, '')::int4);
  IF size < 1 OR size > 1000000 THEN
    RAISE EXCEPTION 'batch_size must be between 1 and 1000000' USING ERRCODE = '22023';
  END IF;
  LOOP
    batch := idempotency.cleanup_batch(size);
    deleted := deleted + batch;
    EXIT WHEN batch < size;
  END LOOP;
  LOOP
    EXIT WHEN idempotency.drop_responses_batch(size) < size;
  END LOOP;
  LOOP
    EXIT WHEN idempotency.adopt_batch(size) < size;
  END LOOP;
  DELETE FROM idempotency.role_secrets s
   WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.rolname = s.owner);
  RETURN deleted;
END
$$;
COMMENT ON FUNCTION idempotency.idempotency_cleanup(integer) IS
  'Deletes expired keys, and keys whose owner names no role or an earlier role of its name, '
  'drops the responses past their response_ttl (the keys stay), and stamps keys restored from '
  'elsewhere with the role of their name, now, in batches of batch_size '
  '(default 5000) with SKIP LOCKED, in the caller''s transaction; returns how many. For '
  'pg_cron prefer CALL idempotency.cleanup_in_batches(), which commits after each batch.';
REVOKE ALL ON FUNCTION idempotency.idempotency_cleanup(integer) FROM PUBLIC;

CREATE OR REPLACE PROCEDURE idempotency.cleanup_in_batches(batch_size pg_catalog.int4 DEFAULT 5000,
                                                           max_batches pg_catalog.int4 DEFAULT 1000)
LANGUAGE plpgsql SECURITY INVOKER
AS $$
DECLARE
  batch int8;
  rounds int4 := 0;
BEGIN
  IF batch_size < 1 OR batch_size > 1000000 OR max_batches < 1 THEN
    RAISE EXCEPTION 'batch_size must be between 1 and 1000000, max_batches positive' USING ERRCODE = '22023';
  END IF;
  LOOP
    batch := idempotency.cleanup_batch(batch_size);
    rounds := rounds + 1;
    COMMIT;  -- each batch its own short transaction: its row locks go at once
    EXIT WHEN batch < batch_size OR rounds >= max_batches;
  END LOOP;
  rounds := 0;
  LOOP
    batch := idempotency.drop_responses_batch(batch_size);
    rounds := rounds + 1;
    COMMIT;
    EXIT WHEN batch < batch_size OR rounds >= max_batches;
  END LOOP;
  rounds := 0;
  LOOP
    batch := idempotency.adopt_batch(batch_size);
    rounds := rounds + 1;
    COMMIT;
    EXIT WHEN batch < batch_size OR rounds >= max_batches;
  END LOOP;
  DELETE FROM idempotency.role_secrets s
   WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.rolname = s.owner);
END
$$;
COMMENT ON PROCEDURE idempotency.cleanup_in_batches(integer, integer) IS
  'What pg_cron runs: idempotency_cleanup in batches of batch_size, each committed on its own '
  '(CALL it outside a transaction block), at most max_batches per call.';
REVOKE ALL ON PROCEDURE idempotency.cleanup_in_batches(integer, integer) FROM PUBLIC;

-- Default privileges of the installing role (ALTER DEFAULT PRIVILEGES ... ON FUNCTIONS) may
-- have granted rights on the cleanup to other roles: nobody but the owner keeps one.
DO $revoke$
DECLARE
  item record;
BEGIN
  FOR item IN
    SELECT DISTINCT p.oid::regprocedure::text AS name, a.grantee, p.prokind
      FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
     WHERE p.pronamespace = 'idempotency'::regnamespace
       AND p.proname IN ('idempotency_cleanup', 'cleanup_batch', 'drop_responses_batch', 'adopt_batch',
                         'cleanup_in_batches')
       AND a.grantee <> p.proowner
  LOOP
    EXECUTE format('REVOKE ALL ON %s %s FROM %s',
                   CASE item.prokind WHEN 'p' THEN 'PROCEDURE' ELSE 'FUNCTION' END, item.name,
                   CASE WHEN item.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(item.grantee)) END);
  END LOOP;
END
$revoke$;
