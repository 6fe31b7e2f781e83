// @ts-check
// pg-idempotency: Idempotency-Key for Express and exactly-once message consumers, over the
// idempotency PostgreSQL extension. Types: index.d.ts.
'use strict';

const { idempotency, policyHandler, policyDocument, defaultFingerprint } = require('./lib/express');
const { parseKey, KeyError, MAX_KEY_LENGTH } = require('./lib/key');
const { sqlstate, isRetryable, isUnavailable, httpAnswerFor } = require('./lib/sql');
const consumer = require('./lib/consumer');

module.exports = {
  idempotency,
  policyHandler,
  policyDocument,
  defaultFingerprint,
  parseKey,
  KeyError,
  MAX_KEY_LENGTH,
  sqlstate,
  isRetryable,
  isUnavailable,
  httpAnswerFor,
  consume: consumer.consume,
  messageKey: consumer.messageKey,
  PermanentError: consumer.PermanentError,
};
