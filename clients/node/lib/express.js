// @ts-check
// The Express middleware: Idempotency-Key as the IETF draft and Stripe's users expect it, over
// the idempotency extension. One request:
//   key parsed (400 when missing on POST / PATCH, empty, malformed, too long)
//   body read whole; fingerprint over method, path and body (JSON as jsonb: key order and
//   spacing do not matter; anything else as bytes), or the caller's
//   claim_key → claimed / reclaimed: the handler runs (inbox: inside the claim's transaction,
//                 given as req.idempotency.client); its answer is held back, stored with
//                 complete_key (status, headers, body bytes), committed, then sent
//               → replay: the stored answer byte for byte, plus Idempotent-Replayed: true
//               → in_progress: 409 with Retry-After (or, with wait, the replay once it exists)
//               → mismatch: 422, nothing of the stored answer
// A handler that throws or answers 5xx stores nothing by default: the inbox transaction rolls
// back with the claim, a two-phase key is released; the retry runs afresh.
'use strict';

const { parseKey, KeyError, MAX_KEY_LENGTH } = require('./key');
const sql = require('./sql');

// Not stored: they describe one connection or one sending, not the answer.
const NOT_STORED = new Set(['connection', 'keep-alive', 'proxy-connection', 'transfer-encoding', 'te',
  'trailer', 'upgrade', 'proxy-authenticate', 'proxy-authorization', 'date', 'content-length',
  'idempotent-replayed']);

const DEFAULTS = {
  policyUrl: '/idempotency-policy',
  mode: 'inbox',
  requiredFor: ['POST', 'PATCH'],
  storeErrors: false,
  waitMs: 0,
  ttlSeconds: 86400,
  leaseSeconds: 30,
  limit: 1024 * 1024,
  maxKeyLength: MAX_KEY_LENGTH,
  retries: 3,
};

/** @param {string | undefined} type */
function isJsonType(type) {
  if (!type) return false;
  const mime = type.split(';')[0].trim().toLowerCase();
  return mime === 'application/json' || /^[a-z0-9!#$&^_.+-]+\/[a-z0-9!#$&^_.+-]+\+json$/.test(mime);
}

/**
 * The default fingerprint input: a JSON document of method, path and body when the body is
 * JSON (hashed as jsonb), else method, path and body bytes (hashed as bytea).
 * @param {import('http').IncomingMessage & { originalUrl?: string, path?: string }} req
 * @param {Buffer} body
 * @returns {{ kind: 'json', value: string } | { kind: 'bytes', value: Buffer }}
 */
function defaultFingerprint(req, body) {
  const method = String(req.method);
  const path = String(req.originalUrl || req.url || '').split('?')[0];
  if (isJsonType(req.headers['content-type']) && body.length > 0) {
    const text = body.toString('utf8');
    try {
      JSON.parse(text);
      // The body's own text, not a re-serialization: jsonb reads its numbers exactly.
      return { kind: 'json', value: `{"method":${JSON.stringify(method)},"path":${JSON.stringify(path)},"body":${text}}` };
    } catch { /* not JSON after all: bytes */ }
  }
  return { kind: 'bytes', value: Buffer.concat([Buffer.from(`${method}\n${path}\n`, 'utf8'), body]) };
}

/**
 * A fingerprint override's answer as claim parameters.
 * @param {any} value
 * @returns {{ kind: 'json' | 'bytes' | 'none', value: any }}
 */
function fingerprintParam(value) {
  if (value === null || value === undefined) return { kind: 'none', value: null };
  if (Buffer.isBuffer(value)) return { kind: 'bytes', value };
  return { kind: 'json', value: JSON.stringify(value) };
}

/**
 * The request's body, read whole (at most limit bytes).
 * @param {import('http').IncomingMessage & { rawBody?: Buffer }} req
 * @param {number} limit
 * @returns {Promise<Buffer>}
 */
function readBody(req, limit) {
  if (Buffer.isBuffer(req.rawBody)) return Promise.resolve(req.rawBody);
  return new Promise((resolve, reject) => {
    /** @type {Buffer[]} */
    const chunks = [];
    let size = 0;
    req.on('data', (c) => {
      size += c.length;
      if (size > limit) {
        const err = Object.assign(new Error('body too large'), { tooLarge: true });
        req.removeAllListeners('data');
        req.resume();
        reject(err);
        return;
      }
      chunks.push(c);
    });
    req.on('end', () => resolve(Buffer.concat(chunks)));
    req.on('error', reject);
  });
}

/**
 * The headers a handler set, names as it spelled them, minus those not stored.
 * @param {import('http').ServerResponse} res
 * @returns {Record<string, string | string[]>}
 */
function storedHeaders(res) {
  /** @type {Record<string, string | string[]>} */
  const out = {};
  const r = /** @type {any} */ (res); // getRawHeaderNames: Node 15.13+, not in every @types/node
  /** @type {string[]} */
  const names = typeof r.getRawHeaderNames === 'function' ? r.getRawHeaderNames() : Object.keys(res.getHeaders());
  for (const name of names) {
    if (NOT_STORED.has(name.toLowerCase())) continue;
    const v = res.getHeader(name);
    if (v === undefined) continue;
    out[name] = Array.isArray(v) ? v.map(String) : String(v);
  }
  return out;
}

/**
 * Sends an answer as stored: status, headers, body bytes.
 * @param {import('http').ServerResponse} res
 * @param {{ status: number, headers: Record<string, string | string[]>, body: Buffer }} answer
 * @param {Record<string, string>} [extra]
 */
function sendStored(res, answer, extra = {}) {
  if (res.headersSent || res.destroyed) return;
  for (const name of res.getHeaderNames()) res.removeHeader(name);
  for (const [name, value] of Object.entries(answer.headers || {})) res.setHeader(name, value);
  for (const [name, value] of Object.entries(extra)) res.setHeader(name, value);
  res.setHeader('Content-Length', answer.body.length);
  res.statusCode = answer.status;
  res.end(answer.body);
}

/**
 * Makes the Express middleware. See index.d.ts for the options.
 * @param {import('../index').IdempotencyOptions} options
 */
function idempotency(options) {
  const o = { ...DEFAULTS, ...options };
  if (!o.pool) throw new TypeError('idempotency: options.pool (a pg.Pool) is required');
  if (o.mode !== 'inbox' && o.mode !== 'two_phase') throw new TypeError('idempotency: mode is inbox or two_phase');
  const requiredFor = new Set(o.requiredFor.map((m) => m.toUpperCase()));
  const log = o.onError || ((/** @type {any} */ err) => console.error('idempotency:', err));
  const policyUrl = o.policyUrl;

  /**
   * A problem+json answer of the middleware.
   * @param {import('http').ServerResponse} res
   * @param {number} status
   * @param {string} title
   * @param {string} detail
   * @param {Record<string, string>} [headers]
   */
  function problem(res, status, title, detail, headers = {}) {
    const body = Buffer.from(JSON.stringify({ type: policyUrl, title, status, detail }));
    sendStored(res, { status, headers: { 'Content-Type': 'application/problem+json', ...headers }, body });
  }

  /**
   * @param {import('http').ServerResponse} res
   * @param {any} err
   */
  function dbProblem(res, err) {
    const a = sql.httpAnswerFor(err);
    if (a.log) log(err);
    const detail = a.status === 503 ? 'The request was not processed; retry with the same Idempotency-Key.'
      : a.status === 400 ? String(err && err.message) : 'The request could not be processed.';
    problem(res, a.status, a.title, detail, a.retryAfter ? { 'Retry-After': String(a.retryAfter) } : {});
  }

  /**
   * Holds the handler's answer back: the returned promise resolves with it once the handler
   * ends the response (res.end), or with null when the connection closes first.
   * @param {import('http').ServerResponse} res
   * @returns {Promise<{ status: number, headers: Record<string, string | string[]>, body: Buffer } | null>}
   */
  function capture(res) {
    /** @type {Buffer[]} */
    const chunks = [];
    const orig = { writeHead: res.writeHead, write: res.write, end: res.end, flushHeaders: res.flushHeaders };
    const restore = () => Object.assign(res, orig);
    /** @param {any} chunk @param {any} [enc] */
    const push = (chunk, enc) => {
      if (chunk === undefined || chunk === null || typeof chunk === 'function') return;
      chunks.push(Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk, /** @type {BufferEncoding} */ (typeof enc === 'string' ? enc : 'utf8')));
    };
    return new Promise((resolve) => {
      /** @type {any} */ (res).writeHead = function writeHead(/** @type {number} */ status, /** @type {any[]} */ ...rest) {
        res.statusCode = status;
        let headers = rest[0];
        if (typeof headers === 'string') { res.statusMessage = headers; headers = rest[1]; }
        if (Array.isArray(headers)) {
          for (let i = 0; i + 1 < headers.length; i += 2) res.setHeader(headers[i], headers[i + 1]);
        } else if (headers) {
          for (const [k, v] of Object.entries(headers)) if (v !== undefined) res.setHeader(k, v);
        }
        return res;
      };
      /** @type {any} */ (res).flushHeaders = () => {};
      /** @type {any} */ (res).write = function write(/** @type {any} */ chunk, /** @type {any} */ enc, /** @type {any} */ cb) {
        push(chunk, enc);
        const done = typeof enc === 'function' ? enc : cb;
        if (typeof done === 'function') process.nextTick(done);
        return true;
      };
      /** @type {any} */ (res).end = function end(/** @type {any} */ chunk, /** @type {any} */ enc, /** @type {any} */ cb) {
        push(chunk, enc);
        restore();
        const done = [chunk, enc, cb].find((x) => typeof x === 'function');
        if (done) res.once('finish', done);
        resolve({ status: res.statusCode, headers: storedHeaders(res), body: Buffer.concat(chunks) });
        return res;
      };
      // A client that goes away does not stop the handler: its answer is still stored (the
      // retry gets the replay); only the sending is skipped.
    });
  }

  /**
   * @param {import('express').Request} req
   * @param {import('express').Response} res
   * @param {import('express').NextFunction} next
   */
  async function middleware(req, res, next) {
    const raw = req.headers['idempotency-key'];
    if (raw === undefined) {
      if (requiredFor.has(String(req.method).toUpperCase())) {
        return problem(res, 400, 'Idempotency-Key missing',
          `${req.method} requests need an Idempotency-Key header; see ${policyUrl}.`);
      }
      return next();
    }
    let key;
    try {
      key = parseKey(String(raw), o.maxKeyLength);
    } catch (err) {
      if (err instanceof KeyError) return problem(res, 400, 'Invalid Idempotency-Key', err.message);
      throw err;
    }

    let body;
    try {
      body = await readBody(req, o.limit);
    } catch (err) {
      if (/** @type {any} */ (err).tooLarge) return problem(res, 413, 'Request body too large', `At most ${o.limit} bytes.`);
      return next(err);
    }
    // The body stays readable for the handler: raw, and parsed when it is JSON.
    const r = /** @type {any} */ (req);
    r.rawBody = body;
    r._body = true; // body-parser: already read
    if (r.body === undefined && isJsonType(req.headers['content-type']) && body.length > 0) {
      try { r.body = JSON.parse(body.toString('utf8')); } catch { /* the handler decides */ }
    }

    let scope;
    let fp;
    try {
      scope = o.scope ? String(await o.scope(req)) : '';
      fp = o.fingerprint ? fingerprintParam(await o.fingerprint(req, body)) : defaultFingerprint(req, body);
    } catch (err) {
      return next(err);
    }
    const params = [key, fp.value, scope, sql.interval(o.ttlSeconds),
      o.mode === 'two_phase' ? sql.interval(o.leaseSeconds) : null, sql.intervalMs(o.waitMs)];
    const claimText = sql.claimSql(fp.kind);

    /** @type {import('pg').PoolClient | undefined} */
    let client;
    let broken = false;
    // A session lost while this request holds it (a server restart, a terminated backend) is
    // an 'error' event on the client, which pg's pool listens for only while it is idle.
    const onLost = () => { broken = true; };
    const done = () => {
      if (client) { client.off('error', onLost); client.release(broken ? true : undefined); client = undefined; }
    };
    try {
      let claim;
      try {
        claim = await sql.withRetry(async () => {
          if (!client) { client = await o.pool.connect(); client.on('error', onLost); }
          if (o.mode === 'two_phase') return (await client.query(claimText, params)).rows[0];
          await client.query('BEGIN');
          try {
            return (await client.query(claimText, params)).rows[0];
          } catch (err) {
            await client.query('ROLLBACK').catch(() => { broken = true; });
            throw err;
          }
        }, o.retries);
      } catch (err) {
        if (sql.isUnavailable(err)) broken = true;
        done();
        return dbProblem(res, err);
      }
      const c = /** @type {any} */ (client);
      const endTx = async (/** @type {string} */ stmt) => {
        if (o.mode === 'inbox') await c.query(stmt);
      };

      switch (claim.status) {
        case 'replay': {
          await endTx('ROLLBACK');
          done();
          const stored = claim.response_body != null
            ? { status: claim.response_code ?? 200, headers: claim.response_headers || {}, body: claim.response_body }
            : { status: claim.response_code ?? 200, headers: claim.response_headers || { 'Content-Type': 'application/json' },
                body: Buffer.from(claim.response == null ? '' : JSON.stringify(claim.response)) };
          return sendStored(res, stored, { 'Idempotent-Replayed': 'true' });
        }
        case 'in_progress':
          await endTx('ROLLBACK');
          done();
          return problem(res, 409, 'Request in progress',
            'A request with this Idempotency-Key is still being processed; retry later.',
            { 'Retry-After': String(Math.max(1, Number(claim.retry_after) || 1)) });
        case 'mismatch':
          await endTx('ROLLBACK');
          done();
          return problem(res, 422, 'Idempotency-Key reused',
            'This Idempotency-Key was used with another request (method, path or body).');
        case 'claimed':
        case 'reclaimed':
          break;
        default:
          throw new Error(`idempotency: unexpected claim status ${claim.status}`);
      }

      const token = claim.token;
      if (o.mode === 'two_phase') done(); // the claim is committed; the handler uses its own connections
      r.idempotency = {
        key, scope, token, status: claim.status, recoveryPoint: claim.recovery_point, attempts: claim.attempts,
        mode: o.mode,
        client: o.mode === 'inbox' ? c : undefined,
        /** @param {string} point @param {number} [leaseSeconds] */
        checkpoint: async (point, leaseSeconds) => {
          const q = [key, token, point, scope, sql.interval(leaseSeconds ?? (o.mode === 'two_phase' ? o.leaseSeconds : null))];
          return (await (o.mode === 'inbox' ? c.query(sql.CHECKPOINT_SQL, q) : o.pool.query(sql.CHECKPOINT_SQL, q))).rows[0].lease_ends;
        },
      };
      const answerPromise = capture(res);
      next();
      const answer = await answerPromise;
      const store = answer !== null && (answer.status < 500 || o.storeErrors);

      if (o.mode === 'inbox') {
        if (!store) {
          await c.query('ROLLBACK').catch(() => { broken = true; });
          done();
          if (answer) sendStored(res, answer);
          return;
        }
        try {
          await c.query(sql.COMPLETE_SQL, [key, token, null, answer.status, scope, answer.body, JSON.stringify(answer.headers)]);
          await c.query('COMMIT');
        } catch (err) {
          await c.query('ROLLBACK').catch(() => { broken = true; });
          if (sql.isUnavailable(err)) broken = true;
          done();
          return dbProblem(res, err);
        }
        done();
        return sendStored(res, answer);
      }

      // two_phase: complete (or release) in a statement of its own.
      try {
        await sql.withRetry(() => (store
          ? o.pool.query(sql.COMPLETE_SQL, [key, token, null, answer.status, scope, answer.body, JSON.stringify(answer.headers)])
          : o.pool.query(sql.RELEASE_SQL, [key, token, scope])), o.retries);
      } catch (err) {
        // The effect happened (or failed) all the same: say what it was; the key stays
        // claimed until its lease ends, then the next retry reclaims it.
        log(err);
        if (store && sql.sqlstate(err) === '54000') return dbProblem(res, err);
      }
      if (answer) sendStored(res, answer);
    } catch (err) {
      if (client && o.mode === 'inbox') await client.query('ROLLBACK').catch(() => { broken = true; });
      done();
      if (!res.headersSent) return dbProblem(res, err);
      log(err);
    }
  }

  /**
   * The published policy (GET /idempotency-policy).
   * @param {import('express').Request} _req
   * @param {import('express').Response} res
   */
  function policy(_req, res) {
    res.json(policyDocument(o));
  }

  const mw = /** @type {any} */ ((/** @type {any} */ req, /** @type {any} */ res, /** @type {any} */ next) => {
    middleware(req, res, next).catch(next);
  });
  /**
   * Express error middleware: a handler's exception under this middleware becomes a 500
   * problem+json (held back and, unless storeErrors, not stored, like any 5xx).
   * @param {any} err
   * @param {import('express').Request} req
   * @param {import('express').Response} res
   * @param {import('express').NextFunction} next
   */
  function errorHandler(err, req, res, next) {
    if (!(/** @type {any} */ (req)).idempotency || res.headersSent) return next(err);
    // The database went away under the handler (a lost connection, 08xxx, 57P0x): 503, retry.
    if (sql.isUnavailable(err)) return dbProblem(res, err);
    log(err);
    problem(res, 500, 'Internal error', o.storeErrors
      ? 'The request failed; this answer is stored under the Idempotency-Key.'
      : 'The request failed and nothing was stored; retrying with the same Idempotency-Key is safe.');
  }

  mw.policy = policy;
  mw.errorHandler = errorHandler;
  mw.policyDocument = () => policyDocument(o);
  return /** @type {import('../index').IdempotencyMiddleware} */ (mw);
}

/**
 * The policy clients read to learn the rules.
 * @param {{ requiredFor?: string[], maxKeyLength?: number, ttlSeconds?: number }} o
 */
function policyDocument(o) {
  return {
    header: 'Idempotency-Key',
    required_for: (o.requiredFor || DEFAULTS.requiredFor).map((m) => m.toUpperCase()),
    max_length: o.maxKeyLength ?? MAX_KEY_LENGTH,
    ttl_seconds: o.ttlSeconds ?? DEFAULTS.ttlSeconds,
  };
}

/**
 * A standalone handler for the policy document.
 * @param {{ requiredFor?: string[], maxKeyLength?: number, ttlSeconds?: number }} [options]
 * @returns {import('express').RequestHandler}
 */
function policyHandler(options = {}) {
  return (_req, res) => { res.json(policyDocument(options)); };
}

module.exports = { idempotency, policyHandler, policyDocument, defaultFingerprint, isJsonType };
