// @ts-check
// A libpq connection string, keyword/value ("host=... dbname=...") or URI, as pg's client
// configuration (pg reads URIs itself, not keyword/value strings).
'use strict';

const KEYWORDS = {
  host: 'host', hostaddr: 'host', port: 'port', user: 'user', password: 'password', dbname: 'database',
  application_name: 'application_name', connect_timeout: 'connectionTimeoutMillis',
};

/**
 * @param {string} dsn
 * @returns {import('pg').ClientConfig}
 */
function clientConfig(dsn) {
  if (/^postgres(ql)?:\/\//.test(dsn)) return { connectionString: dsn };
  /** @type {Record<string, any>} */
  const config = {};
  const re = /\s*([A-Za-z_]+)\s*=\s*(?:'((?:[^'\\]|\\.)*)'|(\S*))/gy;
  let m;
  let last = 0;
  while ((m = re.exec(dsn)) !== null) {
    last = re.lastIndex;
    const value = m[2] !== undefined ? m[2].replace(/\\(.)/g, '$1') : m[3].replace(/\\(.)/g, '$1');
    const name = /** @type {keyof typeof KEYWORDS} */ (m[1]);
    const target = KEYWORDS[name];
    if (!target) continue; // sslmode and the like: pg's defaults
    config[target] = target === 'port' ? Number(value)
      : target === 'connectionTimeoutMillis' ? Number(value) * 1000 : value;
  }
  if (dsn.slice(last).trim() !== '') throw new TypeError(`cannot read the connection string at: ${dsn.slice(last)}`);
  return config;
}

module.exports = { clientConfig };
