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
 * adds seenMany/rememberMany/claimMany. `calls` records every call.
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
    }
  }
  if (options.batch) {
    store.seenMany = wrap('seenMany', (keys) => keys.map((k) => done.has(k)));
    store.rememberMany = wrap('rememberMany', (keys, ttl) => { for (const k of keys) { done.set(k, ttl ?? null); claims.delete(k); } });
  }
  return store;
}

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * A Map-backed store with claims that expire in real time (Date.now), as a
 * shared backend would. leases: 'none' (claim/release/claimMany only:
 * no lease methods), 'fenced' (+ renew and rememberFenced) or 'settle' (+ settle).
 * mode: 'sync' | 'async'. `calls` records every call.
 */
export function expiringStore(leases = 'none', mode = 'async') {
  const done = new Map();
  const claims = new Map(); // key -> { token, until }
  const calls = [];
  let nextToken = 0;
  const wrap = (name, fn) => (...args) => {
    calls.push(name);
    if (mode === 'sync') return fn(...args);
    return tick().then(() => fn(...args));
  };
  const live = (k) => { const c = claims.get(k); return c !== undefined && c.until > Date.now(); };
  const owns = (k, token) => claims.get(k)?.token === token; // live or lapsed, not taken over
  const remember = (k, ttl) => { done.set(k, ttl ?? null); claims.delete(k); };
  const claim = (k, leaseMs) => {
    if (done.has(k)) return { state: 'seen' };
    if (live(k)) return { state: 'held' };
    const token = `t${++nextToken}`;
    claims.set(k, { token, until: Date.now() + leaseMs });
    return { state: 'acquired', token };
  };
  const release = (k, token) => { if (owns(k, token)) claims.delete(k); };
  const renew = (k, token, leaseMs) => {
    if (!owns(k, token)) return false;
    claims.get(k).until = Date.now() + leaseMs;
    return true;
  };
  const rememberFenced = (k, token, ttl) => {
    if (owns(k, token)) { remember(k, ttl); return true; }
    if (!done.has(k) && !live(k)) remember(k, ttl);
    return false;
  };
  const store = {
    done, claims, calls,
    seen: wrap('seen', (k) => done.has(k)),
    remember: wrap('remember', remember),
    forget: wrap('forget', (k) => { done.delete(k); claims.delete(k); }),
    seenMany: wrap('seenMany', (keys) => keys.map((k) => done.has(k))),
    rememberMany: wrap('rememberMany', (keys, ttl) => { for (const k of keys) remember(k, ttl); }),
    claim: wrap('claim', claim),
    release: wrap('release', release),
    claimMany: wrap('claimMany', (keys, leaseMs) => keys.map((k) => claim(k, leaseMs))),
  };
  if (leases === 'fenced') {
    store.renew = wrap('renew', renew);
    store.rememberFenced = wrap('rememberFenced', rememberFenced);
  }
  if (leases === 'settle') {
    store.settle = wrap('settle', (step) => {
      for (const { key, token } of step.release) release(key, token);
      const renewed = step.renew.map(({ key, token }) => renew(key, token, step.leaseMs));
      const kept = step.remember.map(({ key, token }) => {
        if (token === undefined) { remember(key, step.ttlMs); return true; }
        return rememberFenced(key, token, step.ttlMs);
      });
      return { kept, renewed };
    });
  }
  return store;
}
