-- The read ceiling: a batched primary-key SELECT .. WHERE key = ANY($1) of :n stored responses.
\set s random(1, :nkeys - :n)
\set e :s + :n - 1
SELECT key, response, response_code FROM floor_keys
 WHERE owner = current_user AND scope = '' AND key = ANY (ARRAY(SELECT 'c' || g FROM generate_series(:s::int, :e::int) g));
