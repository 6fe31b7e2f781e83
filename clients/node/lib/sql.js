// @ts-check
// The SQL this package issues, and what a database error means. Every call names the schema
// and types every parameter, so it reaches the extension's function and no other (an untyped
// request_fingerprint($1) would take the text overload: JSON key order would then matter).
'use strict';

const CLAIM_COLUMNS = `status::text AS status, token::text AS token, response, response_code,
  response_body, response_headers, recovery_point, attempts,
  ceil(extract(epoch FROM retry_after))::int AS retry_after`;

/**
 * The claim statement. $1 key, $2 fingerprint input (jsonb text, bytea, or a ready
 * fingerprint), $3 scope, $4 ttl, $5 lease, $6 wait.
 * @param {'json' | 'bytes' | 'raw' | 'none'} fingerprintKind
 */
function claimSql(fingerprintKind) {
  const fp = {
    json: 'idempotency.request_fingerprint($2::jsonb)',
    bytes: 'idempotency.request_fingerprint($2::bytea)',
    raw: '$2::bytea',
    none: 'NULL::bytea',
  }[fingerprintKind];
  return `SELECT ${CLAIM_COLUMNS}
    FROM idempotency.claim_key($1::text, ${fp}, $3::text,
                               ttl => $4::interval, lease => $5::interval, wait => $6::interval)`;
}

// complete_key with the response's bytes and headers (byte-for-byte replay), or a jsonb
// response (consumers). $1 key, $2 token, $3 response, $4 code, $5 scope, $6 body, $7 headers.
const COMPLETE_SQL = `SELECT status::text AS status
  FROM idempotency.complete_key($1::text, $2::uuid, $3::jsonb, $4::int, $5::text,
                                response_body => $6::bytea, response_headers => $7::jsonb)`;
const RELEASE_SQL = 'SELECT idempotency.release_key($1::text, $2::uuid, $3::text)';
// $1 key, $2 token, $3 recovery point, $4 scope, $5 lease (NULL: the claim's).
const CHECKPOINT_SQL = `SELECT idempotency.checkpoint_key($1::text, $2::uuid, $3::text, $4::text,
                                                          lease => $5::interval) AS lease_ends`;

// claim_keys over a batch: $1 keys, $2 JSON bodies (NULL where not JSON), $3 byte bodies (NULL
// where JSON), $4 scope, $5 ttl, $6 lease. Fingerprints pair with keys by position.
const CLAIM_KEYS_SQL = `SELECT ordinality, key, ${CLAIM_COLUMNS}
  FROM idempotency.claim_keys($1::text[],
         ARRAY(SELECT CASE WHEN j IS NOT NULL THEN idempotency.request_fingerprint(j)
                           ELSE idempotency.request_fingerprint(b) END
                 FROM unnest($2::jsonb[], $3::bytea[]) WITH ORDINALITY AS u(j, b, i) ORDER BY i),
         $4::text, ttl => $5::interval, lease => $6::interval)
  ORDER BY ordinality`;
const COMPLETE_KEYS_SQL = `SELECT count(*)::int AS completed
  FROM idempotency.complete_keys($1::text[], $2::uuid[], $3::jsonb[], NULL::int[], $4::text)`;

/** @param {number | null | undefined} seconds */
function interval(seconds) {
  return seconds == null ? null : `${Number(seconds)} seconds`;
}

/** @param {number | null | undefined} ms */
function intervalMs(ms) {
  return `${Math.max(0, Number(ms || 0))} milliseconds`;
}

/**
 * The SQLSTATE of a pg error ('' for a lost connection or a non-database error).
 * @param {any} err
 * @returns {string}
 */
function sqlstate(err) {
  return err && typeof err.code === 'string' && /^[0-9A-Z]{5}$/.test(err.code) ? err.code : '';
}

// Citus refuses some statements while a shard moves: worth another try, recognised narrowly.
const CITUS_TRANSIENT = /cannot execute a distributed query from a query on a shard/;

/**
 * A failure that the same statements can retry at once: a serialization failure, a
 * deadlock, or Citus' transient XX000.
 * @param {any} err
 */
function isRetryable(err) {
  const code = sqlstate(err);
  return code === '40001' || code === '40P01' ||
    (code === 'XX000' && CITUS_TRANSIENT.test(String(err && err.message)));
}

/**
 * The database is unreachable or going away: connection errors (class 08), shutdown and
 * cancel-by-admin (57P01..57P05), or a connection lost before any SQLSTATE came back.
 * @param {any} err
 */
function isUnavailable(err) {
  const code = sqlstate(err);
  if (code.startsWith('08') || /^57P0[1-5]$/.test(code) || code === '53300') return true;
  if (code !== '') return false;
  const text = String(err && err.message);
  return /Connection terminated|ECONNREFUSED|ECONNRESET|EPIPE|ENOENT|Client has encountered a connection error|timeout exceeded when trying to connect|connection is closed/i
    .test(text) || (err && typeof err.code === 'string' && /^E[A-Z]+$/.test(err.code));
}

/**
 * How an HTTP API answers a database error of this package's own statements.
 * @param {any} err
 * @returns {{ status: number, title: string, retryAfter?: number, log: boolean }}
 */
function httpAnswerFor(err) {
  const code = sqlstate(err);
  if (code === '22001') return { status: 400, title: 'Idempotency-Key or scope too long', log: false };
  if (code.startsWith('22')) return { status: 400, title: 'Invalid request', log: false };
  if (code === '54000') return { status: 413, title: 'Response too large to store', log: true };
  if (isRetryable(err)) return { status: 503, title: 'Busy, retry', retryAfter: 1, log: false };
  if (isUnavailable(err)) return { status: 503, title: 'Database unavailable', retryAfter: 1, log: true };
  if (code === '42501') return { status: 500, title: 'Set-up error', log: true };
  return { status: 500, title: 'Internal error', log: true };
}

/**
 * Runs fn up to attempts times while it fails with a retryable error.
 * @template T
 * @param {() => Promise<T>} fn
 * @param {number} [attempts]
 * @returns {Promise<T>}
 */
async function withRetry(fn, attempts = 3) {
  for (let i = 1; ; i++) {
    try {
      return await fn();
    } catch (err) {
      if (i >= attempts || !isRetryable(err)) throw err;
    }
  }
}

module.exports = {
  claimSql, COMPLETE_SQL, RELEASE_SQL, CHECKPOINT_SQL, CLAIM_KEYS_SQL, COMPLETE_KEYS_SQL,
  interval, intervalMs, sqlstate, isRetryable, isUnavailable, httpAnswerFor, withRetry,
};
