// Key parsing, without a server: node --test test/key.test.js
'use strict';

const test = require('node:test');
const assert = require('node:assert/strict');
const { parseKey, KeyError, MAX_KEY_LENGTH } = require('..');

test('a Structured Field string: quotes removed, \\" and \\\\ unescaped', () => {
  assert.equal(parseKey('"abc"'), 'abc');
  assert.equal(parseKey('"a b\\"c\\\\d"'), 'a b"c\\d');
  assert.equal(parseKey('  "8e03978e-40d5-43e8-bc93-6894a57f9324"\t'), '8e03978e-40d5-43e8-bc93-6894a57f9324');
  assert.equal(parseKey('"a,b;c=d"'), 'a,b;c=d');
});

test('a bare token: tchars, ":" and "/" (a bare UUID, a URN)', () => {
  assert.equal(parseKey('8e03978e-40d5-43e8-bc93-6894a57f9324'), '8e03978e-40d5-43e8-bc93-6894a57f9324');
  assert.equal(parseKey("urn:order/42!#$%&'*+-.^_`|~"), "urn:order/42!#$%&'*+-.^_`|~");
});

test('empty keys are refused', () => {
  for (const v of ['', '   ', '""']) assert.throws(() => parseKey(v), KeyError, JSON.stringify(v));
});

test('malformed keys are refused', () => {
  const bad = [
    '"abc', // not closed
    '"ab"c"', // after the closing quote
    '"a\\b"', // escape of another character
    '"a\\"', // escape at the end: not closed
    '"é"', // not ASCII
    '"a\tb"', // a control character
    'a b', // a space in a token
    'a,b', // two values (also what Node makes of two headers)
    '"a", "b"',
    'a;b',
    'ключ',
    '(x)',
    'a"b',
    '"abc";p=1', // parameters are not taken
  ];
  for (const v of bad) assert.throws(() => parseKey(v), KeyError, JSON.stringify(v));
});

test('1 to 255 bytes after parsing: 255 passes, 256 is refused (also quoted, also escaped)', () => {
  assert.equal(MAX_KEY_LENGTH, 255);
  assert.equal(parseKey('k'), 'k');
  assert.equal(parseKey('a'.repeat(255)), 'a'.repeat(255));
  assert.throws(() => parseKey('a'.repeat(256)), /256 bytes/);
  assert.equal(parseKey(`"${'a'.repeat(255)}"`), 'a'.repeat(255));
  assert.throws(() => parseKey(`"${'a'.repeat(256)}"`), KeyError);
  // 254 characters and one escaped quote: 255 bytes parsed (258 on the wire)
  assert.equal(parseKey(`"${'a'.repeat(254)}\\""`).length, 255);
  assert.throws(() => parseKey(`"${'a'.repeat(255)}\\""`), KeyError);
  assert.throws(() => parseKey('abcd', 3), KeyError);
});

test('the key error says what is wrong, for the client', () => {
  assert.throws(() => parseKey('a b'), /quoted string .* or a token/);
  assert.throws(() => parseKey('"abc'), /not closed/);
  assert.throws(() => parseKey('""'), /empty/);
});
