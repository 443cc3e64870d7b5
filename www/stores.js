// The playground's stores, all behind the package's DedupeStore interface
// (seen / remember / forget, plus claim / release; the memory and persistent
// stores also keep leases: renew / rememberFenced):
//   - memory:     the Rust InMemoryStore (manual clock, so "advance" moves its TTLs);
//   - persistent: localStorage (survives a reload), synchronous;
//   - worker:     the fixture worker's Durable Object store over HTTP (same origin;
//                 asks for the worker's admin token, EXAMPLE_ADMIN_TOKEN).
// Each also lists its entries for the timeline: [{ key, state, expiresAt }].

/** A simulated clock: the real time plus an offset the page can advance. */
export class SimClock {
  constructor(storageKey = null) {
    this.storageKey = storageKey;
    this.offset = storageKey ? Number(localStorage.getItem(storageKey) ?? 0) || 0 : 0;
  }
  now() { return Date.now() + this.offset; }
  advance(ms) {
    this.offset += ms;
    if (this.storageKey) localStorage.setItem(this.storageKey, String(this.offset));
  }
  reset() {
    this.offset = 0;
    if (this.storageKey) localStorage.removeItem(this.storageKey);
  }
}

/** The Rust InMemoryStore with a manual clock. */
export function memoryStore(bq) {
  const store = new bq.InMemoryStore({ manualClock: true, now: Date.now() });
  let offset = 0;
  return {
    kind: 'memory',
    store,
    canAdvance: true,
    advance: (ms) => { store.advance(ms); offset += ms; },
    clockOffset: () => offset,
    now: () => store.now,
    entries: async () => store.entries(),
    dispose: () => store.free(),
  };
}

const PREFIX = 'bq-dedupe-playground:';
const DONE = `${PREFIX}done:`;
const CLAIM = `${PREFIX}claim:`;

/** A localStorage seen-set: one item per key, `{ expiresAt }`; claims `{ token, until }`. */
export function persistentStore() {
  const clock = new SimClock(`${PREFIX}clock-offset`);
  const read = (k) => {
    try { return JSON.parse(localStorage.getItem(k)); } catch { return null; }
  };
  const live = (key) => {
    const e = read(DONE + key);
    if (!e) return false;
    if (e.expiresAt !== null && clock.now() >= e.expiresAt) {
      localStorage.removeItem(DONE + key);
      return false;
    }
    return true;
  };
  const liveClaim = (key) => {
    const c = read(CLAIM + key);
    return c && clock.now() < c.until ? c : null;
  };
  let tokens = 0;
  const store = {
    seen: (key) => live(key),
    remember: (key, ttlMs) => {
      const expiresAt = ttlMs === undefined || ttlMs === null ? null : clock.now() + ttlMs;
      localStorage.setItem(DONE + key, JSON.stringify({ expiresAt }));
      localStorage.removeItem(CLAIM + key);
    },
    forget: (key) => {
      localStorage.removeItem(DONE + key);
      localStorage.removeItem(CLAIM + key);
    },
    claim: (key, leaseMs) => {
      if (live(key)) return { state: 'seen' };
      if (liveClaim(key)) return { state: 'held' };
      const token = `${Date.now().toString(36)}-${(tokens += 1)}`;
      localStorage.setItem(CLAIM + key, JSON.stringify({ token, until: clock.now() + leaseMs }));
      return { state: 'acquired', token };
    },
    release: (key, token) => {
      if (read(CLAIM + key)?.token === token) localStorage.removeItem(CLAIM + key);
    },
    // Leases: a claim is ours while its token is stored (live, or lapsed and not taken over).
    renew: (key, token, leaseMs) => {
      if (read(CLAIM + key)?.token !== token) return false;
      localStorage.setItem(CLAIM + key, JSON.stringify({ token, until: clock.now() + leaseMs }));
      return true;
    },
    rememberFenced: (key, token, ttlMs) => {
      const ours = read(CLAIM + key)?.token === token;
      if (ours || (!live(key) && !liveClaim(key))) store.remember(key, ttlMs);
      return ours;
    },
  };
  const entries = async () => {
    const out = [];
    // The keys first: checking liveness removes expired items, which would shift
    // the indexes of a live walk and skip the next entry.
    const keys = Array.from({ length: localStorage.length }, (_, i) => localStorage.key(i));
    for (const k of keys) {
      if (k.startsWith(DONE) && live(k.slice(DONE.length))) {
        out.push({ key: k.slice(DONE.length), state: 'done', expiresAt: read(k).expiresAt });
      } else if (k.startsWith(CLAIM) && liveClaim(k.slice(CLAIM.length))) {
        out.push({ key: k.slice(CLAIM.length), state: 'claimed', expiresAt: read(k).until });
      }
    }
    return out.sort((a, b) => a.key.localeCompare(b.key));
  };
  const clear = () => {
    const keys = [];
    for (let i = 0; i < localStorage.length; i += 1) keys.push(localStorage.key(i));
    for (const k of keys) if (k.startsWith(DONE) || k.startsWith(CLAIM)) localStorage.removeItem(k);
    clock.reset(); // a reset store starts at the real time again
  };
  return {
    kind: 'persistent',
    store,
    canAdvance: true,
    advance: (ms) => clock.advance(ms),
    clockOffset: () => clock.offset,
    now: () => clock.now(),
    entries,
    clear,
    dispose: () => {},
  };
}

// The fixture worker's routes need `Authorization: Bearer <EXAMPLE_ADMIN_TOKEN>`.
// The page asks for the token once per tab (kept in sessionStorage) and asks
// again after the worker refused it.
const TOKEN_KEY = 'bq-dedupe-worker-token';

function workerToken({ ask = true } = {}) {
  let token = sessionStorage.getItem(TOKEN_KEY);
  if (!token && ask && typeof prompt === 'function') {
    token = (prompt('The fixture worker\u2019s admin token (EXAMPLE_ADMIN_TOKEN; make dev prints it):') ?? '').trim();
    if (token) sessionStorage.setItem(TOKEN_KEY, token);
  }
  return token || '';
}

async function workerFetch(path, init = {}) {
  const res = await fetch(path, {
    ...init,
    headers: { ...(init.headers ?? {}), authorization: `Bearer ${workerToken()}` },
  });
  if (res.status === 401) sessionStorage.removeItem(TOKEN_KEY); // ask again next time
  return res;
}

async function post(path, body) {
  const res = await workerFetch(path, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  if (!res.ok) {
    const error = new Error(`${path}: HTTP ${res.status} ${await res.text().catch(() => '')}`.trim());
    error.kind = res.status >= 500 || res.status === 429 ? 'unavailable' : 'internal';
    throw error;
  }
  return res.json();
}

/**
 * Is the page served by the fixture worker? Its `GET stats` answers JSON with
 * the token, or 401 with `WWW-Authenticate: Bearer` without one (no token is
 * needed to find out). A worker with no token configured (403) offers no store.
 */
export async function workerAvailable() {
  try {
    const res = await fetch('stats', { headers: { accept: 'application/json' } });
    if (res.status === 401) return (res.headers.get('www-authenticate') ?? '').startsWith('Bearer');
    if (!res.ok || !(res.headers.get('content-type') ?? '').includes('json')) return false;
    await res.json();
    return true;
  } catch {
    return false;
  }
}

/** The fixture worker's Durable Object store over its HTTP endpoints (relative URLs). */
export function workerStore() {
  workerToken(); // asked for now, when the store is chosen
  const ttl = (ms) => (ms === undefined || ms === null ? null : ms);
  const store = {
    seen: async (key) => (await post('store/seen', { keys: [key] })).seen[0],
    seenMany: async (keys) => (await post('store/seen', { keys })).seen,
    remember: async (key, ttlMs) => { await post('store/remember', { keys: [key], ttl_ms: ttl(ttlMs) }); },
    rememberMany: async (keys, ttlMs) => { await post('store/remember', { keys, ttl_ms: ttl(ttlMs) }); },
    forget: async (key) => { await post('store/forget', { keys: [key] }); },
    claim: async (key, leaseMs) => (await post('store/claim', { keys: [key], lease_ms: leaseMs })).claims[0],
    claimMany: async (keys, leaseMs) => (await post('store/claim', { keys, lease_ms: leaseMs })).claims,
    release: async (key, token) => { await post('store/release', { releases: [{ key, token }] }); },
  };
  const entries = async () => {
    const res = await workerFetch('store/entries', { headers: { accept: 'application/json' } });
    if (!res.ok) throw new Error(`store/entries: HTTP ${res.status}`);
    return (await res.json()).entries.map((e) => ({ key: e.key, state: e.state, expiresAt: e.expires_at ?? null }));
  };
  return {
    kind: 'worker',
    store,
    canAdvance: false,
    advance: () => {},
    clockOffset: () => 0,
    now: () => Date.now(),
    entries,
    dispose: () => {},
  };
}
