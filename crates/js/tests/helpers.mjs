// Shared by the Node tests: the package (through its own exports map, "node"
// condition -> pkg/node), envelopes, and JS stores of every shape.
import * as bq from '@babelqueue/dedupe';
import { readFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';

export { bq };

export const CONFORMANCE_DIR = fileURLToPath(new URL('../../../tests/conformance/', import.meta.url));
export const manifestText = () => readFile(CONFORMANCE_DIR + 'manifest.json', 'utf8');
export const loadFixture = (path) => readFile(CONFORMANCE_DIR + path);

/** A valid envelope with the given meta.id (undefined: no id at all). */
export function envelope(id, extra = {}) {
  const meta = { schema_version: 1 };
  if (id !== undefined) meta.id = id;
  return { job: 'urn:babel:orders:created', trace_id: 't-1', data: { order_id: 1 }, meta, attempts: 0, ...extra };
}

const tick = () => new Promise((resolve) => setTimeout(resolve, 1));

/**
 * A Map-backed store. mode: 'sync' | 'async' (every method returns a promise that
 * settles on a later macrotask). options.claims adds claim/release; options.batch
 * adds seenMany/rememberMany/claimMany/commitMany. `calls` records every call.
 */
export function mapStore(mode = 'sync', options = {}) {
  const done = new Map();
  const claims = new Map();
  const calls = [];
  let nextToken = 0;
  const wrap = (name, fn) => (...args) => {
    calls.push(name);
    if (mode === 'sync') return fn(...args);
    return tick().then(() => fn(...args));
  };
  const store = {
    done, claims, calls,
    seen: wrap('seen', (k) => done.has(k)),
    remember: wrap('remember', (k, ttl) => { done.set(k, ttl ?? null); claims.delete(k); }),
    forget: wrap('forget', (k) => { done.delete(k); claims.delete(k); }),
  };
  if (options.claims) {
    const claim = (k) => {
      if (done.has(k)) return { state: 'seen' };
      if (claims.has(k)) return { state: 'held' };
      const token = `t${++nextToken}`;
      claims.set(k, token);
      return { state: 'acquired', token };
    };
    store.claim = wrap('claim', claim);
    store.release = wrap('release', (k, token) => { if (claims.get(k) === token) claims.delete(k); });
    if (options.batch) {
      store.claimMany = wrap('claimMany', (keys) => keys.map(claim));
      store.commitMany = wrap('commitMany', (keys, ttl, releases) => {
        for (const k of keys) { done.set(k, ttl ?? null); claims.delete(k); }
        for (const { key, token } of releases) if (claims.get(key) === token) claims.delete(key);
      });
    }
  }
  if (options.batch) {
    store.seenMany = wrap('seenMany', (keys) => keys.map((k) => done.has(k)));
    store.rememberMany = wrap('rememberMany', (keys, ttl) => { for (const k of keys) done.set(k, ttl ?? null); });
  }
  return store;
}
