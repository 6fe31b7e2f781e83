// Types of pg-idempotency (CommonJS). Idempotency-Key for Express and exactly-once message
// consumers over the idempotency PostgreSQL extension.
import type { Pool, PoolClient } from 'pg';
import type { ErrorRequestHandler, Request, RequestHandler } from 'express';
import type { Channel, Message } from 'amqplib';

/** The longest key, in bytes (idempotency.max_key_length). */
export const MAX_KEY_LENGTH: 255;

/** A malformed, empty or over-long Idempotency-Key (answered 400). */
export class KeyError extends Error {}

/**
 * Parses an Idempotency-Key header value: a Structured Field string (`"abc"`, `\"` and `\\`
 * escapes, printable ASCII) or a bare token (RFC 9110 tchars, `:` and `/`); 1 to maxLength
 * bytes after parsing. Throws KeyError.
 */
export function parseKey(value: string, maxLength?: number): string;

/** What the handler of a claimed request gets as `req.idempotency`. */
export interface RequestIdempotency {
  key: string;
  scope: string;
  token: string;
  status: 'claimed' | 'reclaimed';
  /** The last checkpoint of an earlier attempt (reclaimed), else null. */
  recoveryPoint: string | null;
  attempts: number;
  mode: 'inbox' | 'two_phase';
  /** inbox: the connection of the claim's transaction; the handler's writes must use it. */
  client?: PoolClient;
  /** Records progress (recovery point) and renews the lease; resolves to the lease's new end. */
  checkpoint(recoveryPoint: string, leaseSeconds?: number): Promise<Date>;
}

declare global {
  namespace Express {
    interface Request {
      /** Set by the idempotency middleware for a claimed request. */
      idempotency?: RequestIdempotency;
      /** The request body's bytes, read by the idempotency middleware. */
      rawBody?: Buffer;
    }
  }
}

export interface IdempotencyOptions {
  /** The pool to claim keys with (as an ordinary role with USAGE on schema idempotency). */
  pool: Pool;
  /** inbox (default): the handler runs in the claim's transaction; two_phase: claim and
   *  COMMIT, run, complete (release on a 5xx or an exception). */
  mode?: 'inbox' | 'two_phase';
  /** The `type` of every problem+json answer, and where clients read the rules.
   *  Default '/idempotency-policy'. */
  policyUrl?: string;
  /** The key's scope: the authenticated client or tenant, so that clients never share keys. Default ''. */
  scope?: (req: Request) => string | Promise<string>;
  /** Methods that need a key (400 without). Default ['POST', 'PATCH']. */
  requiredFor?: string[];
  /** Store 5xx answers and exceptions (as the 500 sent) too. Default false: the retry runs afresh. */
  storeErrors?: boolean;
  /** Wait this long for a request in flight, then replay it or answer 409. Default 0. */
  waitMs?: number;
  /** How long keys are kept (claim_key's ttl), published by the policy. Default 86400. */
  ttlSeconds?: number;
  /** The two-phase lease. Default 30. */
  leaseSeconds?: number;
  /** The largest body read, in bytes (413 beyond). Default 1 MiB. */
  limit?: number;
  /** The longest key accepted, in bytes. Default 255. */
  maxKeyLength?: number;
  /** Tries of a claim that failed with 40001 / 40P01 (then 503). Default 3. */
  retries?: number;
  /** The fingerprint's input instead of method, path and body: a Buffer (hashed as bytes),
   *  another value (hashed as jsonb), or null for none. */
  fingerprint?: (req: Request, body: Buffer) => unknown;
  /** Where errors of the middleware's own SQL go. Default console.error. */
  onError?: (err: unknown) => void;
}

export interface PolicyDocument {
  header: 'Idempotency-Key';
  required_for: string[];
  max_length: number;
  ttl_seconds: number;
}

export interface IdempotencyMiddleware extends RequestHandler {
  /** GET handler of the published policy document. */
  policy: RequestHandler;
  policyDocument(): PolicyDocument;
  /** Express error middleware (app.use it last): a handler's exception under the middleware
   *  becomes a 500 problem+json, not stored unless storeErrors. */
  errorHandler: ErrorRequestHandler;
}

/** The Express middleware (put it before the route's handler). */
export function idempotency(options: IdempotencyOptions): IdempotencyMiddleware;
/** A handler answering the policy document. */
export function policyHandler(options?: { requiredFor?: string[]; maxKeyLength?: number; ttlSeconds?: number }): RequestHandler;
export function policyDocument(options: { requiredFor?: string[]; maxKeyLength?: number; ttlSeconds?: number }): PolicyDocument;
export function defaultFingerprint(req: Request, body: Buffer):
  { kind: 'json'; value: string } | { kind: 'bytes'; value: Buffer };

/** The SQLSTATE of a pg error, '' when none. */
export function sqlstate(err: unknown): string;
/** 40001, 40P01 or Citus' transient XX000: retry the transaction. */
export function isRetryable(err: unknown): boolean;
/** The database is unreachable (08xxx, 57P0x, a lost connection). */
export function isUnavailable(err: unknown): boolean;
/** The HTTP answer for a database error. */
export function httpAnswerFor(err: unknown): { status: number; title: string; retryAfter?: number; log: boolean };

/** A handler's error no retry will cure: the message is dead-lettered, not requeued. */
export class PermanentError extends Error {}

/** The message's key: its Idempotency-Key header, else its message id. */
export function messageKey(msg: Message): string | undefined;

export interface MessageContext {
  key: string;
  scope: string;
  token: string;
  status: 'claimed' | 'reclaimed';
  recoveryPoint: string | null;
  attempts: number;
  /** single and batch: the connection of the claim's transaction (batch: in a savepoint). */
  client?: PoolClient;
  checkpoint(recoveryPoint: string, leaseSeconds?: number): Promise<Date>;
}

export interface ConsumerEvent {
  type: 'applied' | 'replay' | 'in_progress' | 'mismatch' | 'dead_letter' | 'retry' | 'db_error';
  key: string | undefined;
  message: Message;
  status?: string;
  error?: unknown;
}

export interface ConsumeOptions {
  channel: Channel;
  pool: Pool;
  queue: string;
  /** Runs once per message key; its result (JSON) is stored with the key. */
  handler: (msg: Message, ctx: MessageContext) => unknown | Promise<unknown>;
  /** single (default), batch or two_phase. */
  mode?: 'single' | 'batch' | 'two_phase';
  /** The channel's prefetch and the largest batch. Default 50. */
  prefetch?: number;
  /** The keys' scope. Default ''. */
  scope?: string;
  /** The keys' ttl (default: the server's idempotency.default_ttl). */
  ttlSeconds?: number | null;
  /** The two-phase lease. Default 30. */
  leaseSeconds?: number;
  /** How long a message is held before its requeue after an error. Default 1000. */
  retryDelayMs?: number;
  /** How long a batch waits to fill up. Default 20. */
  batchLingerMs?: number;
  /** Tries of a claim that failed with 40001 / 40P01. Default 3. */
  retries?: number;
  /** The key (default messageKey); undefined dead-letters the message. */
  key?: (msg: Message) => string | undefined;
  /** The fingerprint's input instead of the body: a Buffer (bytes) or a JSON value. */
  fingerprint?: (msg: Message) => unknown;
  /** Called after each COMMIT, before the ack. */
  afterCommit?: (info: { key: string | undefined; messages: Message[] }) => void | Promise<void>;
  onEvent?: (event: ConsumerEvent) => void;
  onError?: (err: unknown) => void;
}

export interface Consumer {
  consumerTag: string;
  /** No new deliveries; the message or batch in hand finishes; held messages are requeued. */
  stop(): Promise<void>;
}

/** Consumes queue with exactly-once effects. */
export function consume(options: ConsumeOptions): Promise<Consumer>;
