// @ts-check
// The Idempotency-Key header (draft-ietf-httpapi-idempotency-key-header-09): a Structured
// Field string ("abc", with \" and \\ escapes, printable ASCII only) or, for clients that send
// the key bare, a token of RFC 9110 tchars plus ':' and '/' (so a bare UUID or URL-ish key
// passes). 1 to 255 bytes after parsing: the extension's idempotency.max_key_length.
'use strict';

const MAX_KEY_LENGTH = 255;

// RFC 9110 tchar, plus ':' and '/'.
const BARE_TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z:/]+$/;

class KeyError extends Error {
  /** @param {string} message */
  constructor(message) {
    super(message);
    this.name = 'KeyError';
  }
}

/**
 * Parses one Idempotency-Key header value. Throws KeyError (with a message fit for a client)
 * when it is empty, malformed or longer than maxLength bytes.
 * @param {string} value
 * @param {number} [maxLength]
 * @returns {string}
 */
function parseKey(value, maxLength = MAX_KEY_LENGTH) {
  if (typeof value !== 'string') throw new KeyError('Idempotency-Key must be one header value.');
  const v = value.replace(/^[ \t]+|[ \t]+$/g, '');
  if (v === '') throw new KeyError('Idempotency-Key is empty.');
  let key;
  if (v[0] === '"') {
    key = '';
    let i = 1;
    for (;;) {
      if (i >= v.length) throw new KeyError('Idempotency-Key: the quoted string is not closed.');
      const c = v[i];
      const code = v.charCodeAt(i);
      if (code < 0x20 || code > 0x7e) {
        throw new KeyError('Idempotency-Key: only printable ASCII characters are allowed.');
      }
      if (c === '\\') {
        const next = v[i + 1];
        if (next !== '"' && next !== '\\') {
          throw new KeyError('Idempotency-Key: a backslash may only escape " or \\.');
        }
        key += next;
        i += 2;
        continue;
      }
      if (c === '"') {
        if (i !== v.length - 1) throw new KeyError('Idempotency-Key: characters after the quoted string.');
        break;
      }
      key += c;
      i += 1;
    }
    if (key === '') throw new KeyError('Idempotency-Key is empty.');
  } else {
    if (!BARE_TOKEN.test(v)) {
      throw new KeyError('Idempotency-Key must be a quoted string ("...") or a token of letters, digits and !#$%&\'*+-.^_`|~:/');
    }
    key = v;
  }
  const bytes = Buffer.byteLength(key, 'utf8');
  if (bytes > maxLength) {
    throw new KeyError(`Idempotency-Key is ${bytes} bytes long; at most ${maxLength} are allowed.`);
  }
  return key;
}

module.exports = { parseKey, KeyError, MAX_KEY_LENGTH };
