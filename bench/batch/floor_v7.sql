-- The floor: a hand-written batched INSERT .. SELECT unnest($1) ON CONFLICT DO NOTHING RETURNING of :n new keys.
INSERT INTO floor_keys (owner, scope, key, fingerprint, attempts, ttl, lease, created_at, expires_at, lease_token, locked_until, status, updated_at)
SELECT 10, '', k, f, 1, '24 hours', '5 minutes', now(), now() + interval '24 hours', gen_uuid_v7(), now() + interval '5 minutes', 'processing', now()
  FROM unnest(ARRAY(SELECT gen_uuid_v7()::text FROM generate_series(1, :n::int)), ARRAY(SELECT bench_fp() FROM generate_series(1, :n::int))) AS u(k, f)
ON CONFLICT (owner, scope, key) DO NOTHING RETURNING key, lease_token;
