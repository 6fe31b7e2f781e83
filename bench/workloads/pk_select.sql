-- The read ceiling: primary-key SELECT of a stored response.
\set n random(1, :nkeys)
SELECT response, response_code FROM floor_keys WHERE owner = current_user AND scope = '' AND key = 'c' || :n;
