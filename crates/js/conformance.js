// The BabelQueue conformance manifest, run through this package's public API
// (validate, dedupeKey, dedupe, forget): the same reading of manifest.json as the
// core's runner (src/conformance.rs), so Node, the browser playground and the Rust
// tests judge the same things:
//   - every envelope case: valid ones must validate and match their `expect` block,
//     invalid ones must be rejected;
//   - `dedup-key`: the key of the template envelope is `expected_key`;
//   - every idempotency sequence, each on an empty seen-set: deliveries of the
//     template with `meta.id` replaced, the handler throwing where `outcome` is
//     "throw", `forget_before` forgetting the id first; each delivery's effect
//     ("run" when the handler ran, "skip", or the outcome code) must equal
//     `expect_effect`, and the number of runs `expected_effects`.
//
//   import * as bq from '@babelqueue/dedupe';
//   import { runConformance } from '@babelqueue/dedupe/conformance';
//   const report = await runConformance(bq, manifestText, (path) => readFile(dir + path));
//   report.summary  // "13 passed, 0 failed"

const decoder = new TextDecoder();

function text(data) {
  if (typeof data === 'string') return data;
  if (data instanceof ArrayBuffer) return decoder.decode(new Uint8Array(data));
  if (ArrayBuffer.isView(data)) return decoder.decode(data);
  throw new TypeError('loadFixture must return a string, a Uint8Array or an ArrayBuffer');
}

function equal(a, b) {
  if (a === b) return true;
  if (typeof a !== 'object' || typeof b !== 'object' || a === null || b === null) return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  const ka = Object.keys(a);
  const kb = Object.keys(b);
  return ka.length === kb.length && ka.every((k) => Object.hasOwn(b, k) && equal(a[k], b[k]));
}

const show = (v) => (v === undefined ? 'absent' : JSON.stringify(v));

/** Compares a case's `expect` block with the decoded envelope; returns why not, or null. */
function checkExpectations(env, expect) {
  for (const [field, want] of Object.entries(expect ?? {})) {
    let got;
    if (field === 'urn') got = env.job;
    else if (field === 'lang' || field === 'schema_version') got = env.meta?.[field];
    else if (field === 'dead_letter') {
      for (const [k, v] of Object.entries(want ?? {})) {
        const g = env.dead_letter?.[k];
        if (!equal(g, v)) return `dead_letter.${k} is ${show(g)}, expected ${show(v)}`;
      }
      continue;
    } else got = env[field];
    if (!equal(got, want)) return `${field} is ${show(got)}, expected ${show(want)}`;
  }
  return null;
}

function checkCase(api, kase, raw) {
  const v = api.validate(raw);
  if (!kase.valid) return v.valid ? 'accepted an invalid envelope' : null;
  if (!v.valid) return `rejected a valid envelope: ${v.rejection.message}`;
  const env = JSON.parse(raw);
  // The decoded form: canonical `job` (the `urn` alias read as job), attempts 0 when absent.
  env.job = v.job;
  delete env.urn;
  env.attempts = v.attempts;
  return checkExpectations(env, kase.expect);
}

async function checkSequence(api, seq, template, store, options) {
  const envelope = JSON.parse(template);
  let effects = 0;
  for (const [n, d] of seq.deliveries.entries()) {
    if (d.forget_before) await api.forget(d.meta_id, store, options);
    envelope.meta.id = d.meta_id;
    const succeed = d.outcome !== 'throw';
    const outcome = await api.dedupe(JSON.stringify(envelope), store, () => {
      if (!succeed) throw new Error('handler threw');
    }, options);
    const effect = outcome.ran ? 'run' : outcome.kind;
    if (effect !== d.expect_effect) {
      return `delivery ${n + 1} (${JSON.stringify(d.meta_id)}): ${effect}, expected ${d.expect_effect}`;
    }
    // Every handler invocation counts as an effect, thrown or not (as in the core's runner).
    if (outcome.ran) effects += 1;
  }
  return effects === seq.expected_effects ? null : `${effects} effects, expected ${seq.expected_effects}`;
}

/** The number of results a manifest yields: its cases, dedup-key, its sequences. */
export function conformanceCount(manifest) {
  const m = typeof manifest === 'string' ? JSON.parse(manifest) : manifest;
  return m.cases.length + 1 + m.idempotency.sequences.cases.length;
}

/**
 * Runs the manifest through `api` (this package's exports).
 * options.store: a factory returning the store for each sequence (default: a new
 * api.InMemoryStore); options.claimLeaseMs: passed to dedupe (claiming mode).
 * onResult(result) sees each result as it is decided.
 */
export async function runConformance(api, manifest, loadFixture, options = {}, onResult = () => {}) {
  const m = typeof manifest === 'string' ? JSON.parse(manifest) : manifest;
  const makeStore = options.store ?? (() => new api.InMemoryStore());
  const processOptions = {};
  if (options.claimLeaseMs !== undefined) processOptions.claimLeaseMs = options.claimLeaseMs;
  const cache = new Map();
  const load = (path) => {
    if (!cache.has(path)) cache.set(path, Promise.resolve().then(() => loadFixture(path)).then(text));
    return cache.get(path);
  };
  const results = [];
  const record = (name, failure) => {
    const result = { name, passed: failure === null, failure };
    results.push(result);
    onResult(result);
  };
  const attempt = async (name, check) => {
    try {
      record(name, await check());
    } catch (e) {
      record(name, String(e?.message ?? e));
    }
  };

  for (const kase of m.cases) {
    await attempt(kase.name, async () => checkCase(api, kase, await load(kase.file)));
  }
  const key = m.idempotency.dedup_key;
  await attempt('dedup-key', async () => {
    const got = api.dedupeKey(await load(key.envelope_file));
    return got === key.expected_key ? null : `key ${show(got)}, expected ${show(key.expected_key)}`;
  });
  for (const [i, seq] of m.idempotency.sequences.cases.entries()) {
    await attempt(seq.name, async () => {
      const store = await makeStore(i, seq.name);
      try {
        return await checkSequence(api, seq, await load(key.envelope_file), store, processOptions);
      } finally {
        if (!options.store) store.free?.();
      }
    });
  }
  const passed = results.filter((r) => r.passed).length;
  const failed = results.length - passed;
  return { results, passed, failed, summary: `${passed} passed, ${failed} failed` };
}
