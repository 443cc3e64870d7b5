// The JS package against what a JS user writes instead (issue #12, item 7), in Node.
//
//   node crates/js/bench/node.mjs [workload.jsonl] [lines]      (make js-bench)
//   BQ_JS_BENCH_PASSES (default 5), BQ_JS_BENCH_JSON=1 (also one JSON line),
//   BQ_JS_BENCH_MODULE=path/to/bq_dedupe.cjs (another build, for before/after)
//   BQ_NODE_SDK=path/to/bundle.mjs: BabelQueue's own Node helper (@babelqueue/core,
//     not on npm: an esbuild bundle of BabelQueue/babelqueue-node's src/index.ts,
//     never vendored here), measured beside the package as the `sdk` mode
//
// Reads the first `lines` (default 100,000) lines of the bench workload (made by
// `cargo run --release --example gen_workload -- target/bench/workload.jsonl`) as
// JS strings and puts them, in order, through:
//
//   plain       JSON.parse + a Set of meta.id (validates nothing)
//   dedupe      `await dedupe(line, store, handler)` per line (= the deprecated `process`)
//   batch       `await dedupeBatch(lines[i..i+100], store, handler)` (= `processBatch`)
//   wrap        `await wrap(store, handler)(line)` per line: the package's `Wrap` shape
//   sdk         (with BQ_NODE_SDK) per line `EnvelopeCodec.decode` + `accepts`, then
//               `await Wrap(new InMemoryStore(), handler)(envelope)`: what a Node
//               user of BabelQueue runs without this package
//
// each with a fresh InMemoryStore (plain: a fresh Set), for two handlers: `noop`
// (counts, never reads the envelope) and `reads` (reads envelope.data.order_id).
// Every pass runs every mode once, interleaved; a figure is the median of the
// passes, in thousands of deliveries per second. It measures, it never asserts a
// timing; it does check that every mode ran the handler for the same deliveries.
import { readFileSync } from 'node:fs';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { resolve } from 'node:path';

// BQ_JS_BENCH_MODULE: another build of the package's glue (e.g. a copy of an older
// pkg/node/bq_dedupe.cjs), for before/after figures from one run.
const other = process.env.BQ_JS_BENCH_MODULE;
const bq = other ? await import(pathToFileURL(resolve(other)).href) : await import('@babelqueue/dedupe');

const ROOT = fileURLToPath(new URL('../../../', import.meta.url));
const path = process.argv[2] || process.env.BQ_JS_BENCH_WORKLOAD || `${ROOT}target/bench/workload.jsonl`;
const count = Number(process.argv[3] || process.env.BQ_JS_BENCH_LINES || 100_000);
const passes = Number(process.env.BQ_JS_BENCH_PASSES || 5);
const BATCH = 100;

const text = readFileSync(path, 'utf8');
const lines = [];
for (let at = 0; lines.length < count && at < text.length; ) {
  let end = text.indexOf('\n', at);
  if (end < 0) end = text.length;
  if (end > at) lines.push(text.slice(at, end));
  at = end + 1;
}
// Flatten (a slice of one big string is a sliced string in V8; a user's deliveries
// each arrive as their own string).
for (let i = 0; i < lines.length; i++) lines[i] = JSON.parse(JSON.stringify(lines[i]));

function plain(handler) {
  const seen = new Set();
  for (const line of lines) {
    let envelope;
    try {
      envelope = JSON.parse(line);
    } catch {
      continue;
    }
    const id = envelope?.meta?.id;
    if (typeof id === 'string' && seen.has(id)) continue;
    handler(envelope);
    if (typeof id === 'string') seen.add(id);
  }
}

async function single(handler) {
  const store = new bq.InMemoryStore();
  for (const line of lines) await bq.dedupe(line, store, handler);
  store.free();
}

async function batch(handler) {
  const store = new bq.InMemoryStore();
  for (let i = 0; i < lines.length; i += BATCH) {
    await bq.dedupeBatch(lines.slice(i, i + BATCH), store, handler);
  }
  store.free();
}

async function wrapped(handler) {
  const store = new bq.InMemoryStore();
  const w = bq.wrap(store, handler);
  for (const line of lines) {
    try {
      await w(line);
    } catch {
      // an invalid envelope rejects (RejectionError), as the helper's decode throws
    }
  }
  store.free();
}

// BabelQueue's Node helper, when a bundle of it is given.
const sdkPath = process.env.BQ_NODE_SDK;
const sdk = sdkPath ? await import(pathToFileURL(resolve(sdkPath)).href) : null;

async function sdkWrap(handler) {
  const { EnvelopeCodec, Wrap, InMemoryStore } = sdk;
  const wrapped = Wrap(new InMemoryStore(), handler);
  for (const line of lines) {
    let envelope;
    try {
      envelope = EnvelopeCodec.decode(line);
    } catch {
      continue;
    }
    if (!EnvelopeCodec.accepts(envelope)) continue;
    await wrapped(envelope);
  }
}

const modes = sdk
  ? { plain, dedupe: single, batch, wrap: wrapped, sdk: sdkWrap }
  : { plain, dedupe: single, batch, wrap: wrapped };
const results = {};
for (const [hname, make] of Object.entries({
  noop: () => { const ran = { n: 0, sum: 0 }; return [ran, () => { ran.n++; }]; },
  reads: () => { const ran = { n: 0, sum: 0 }; return [ran, (e) => { ran.n++; ran.sum += e.data.order_id; }]; },
})) {
  const times = Object.fromEntries(Object.keys(modes).map((m) => [m, []]));
  const ran = {};
  for (let pass = 0; pass < passes + 1; pass++) {
    for (const [mname, run] of Object.entries(modes)) {
      const [counter, handler] = make();
      const t0 = process.hrtime.bigint();
      await run(handler);
      const ns = Number(process.hrtime.bigint() - t0);
      if (pass > 0) times[mname].push(ns); // pass 0 warms up
      ran[mname] = `${counter.n}/${counter.sum}`;
    }
  }
  const distinct = new Set(Object.values(ran));
  if (distinct.size !== 1) {
    console.error(`the modes disagree on what ran (${hname}):`, ran);
    process.exitCode = 1;
  }
  results[hname] = Object.fromEntries(
    Object.entries(times).map(([m, t]) => {
      t.sort((a, b) => a - b);
      const median = t[t.length >> 1];
      return [m, { kps: lines.length / (median / 1e9) / 1000, min: lines.length / (t[t.length - 1] / 1e9) / 1000, max: lines.length / (t[0] / 1e9) / 1000 }];
    }),
  );
}

const wasm = other ? null : readFileSync(new URL('../pkg/web/bq_dedupe_bg.wasm', import.meta.url)).length;
console.log(`node ${process.version}, ${lines.length} lines of ${path}, median of ${passes} passes (batch of ${BATCH}); k deliveries/s (min-max)${other ? `; module ${other}` : ''}`);
const fmt = (r) => `${r.kps.toFixed(0).padStart(5)} (${r.min.toFixed(0)}-${r.max.toFixed(0)})`.padEnd(20);
console.log(`${'handler'.padEnd(8)} ${'plain JSON.parse+Set'.padEnd(20)} ${'dedupe (process)'.padEnd(20)} ${'dedupeBatch (processBatch)'.padEnd(26)} batch/plain`);
for (const [h, r] of Object.entries(results)) {
  console.log(`${h.padEnd(8)} ${fmt(r.plain)} ${fmt(r.dedupe)} ${fmt(r.batch).padEnd(26)} ${(r.batch.kps / r.plain.kps).toFixed(2)}x`);
}
if (sdk) {
  console.log(`against BabelQueue's Node helper (${sdkPath}: decode + accepts + Wrap):`);
  for (const [h, r] of Object.entries(results)) {
    console.log(`${h.padEnd(8)} sdk ${fmt(r.sdk)} dedupe/sdk ${(r.dedupe.kps / r.sdk.kps).toFixed(2)}x, batch/sdk ${(r.batch.kps / r.sdk.kps).toFixed(2)}x, wrap/sdk ${(r.wrap.kps / r.sdk.kps).toFixed(2)}x, plain/sdk ${(r.plain.kps / r.sdk.kps).toFixed(2)}x`);
  }
} else {
  console.log('(set BQ_NODE_SDK to a bundle of BabelQueue\'s Node helper to measure against it: bench/README.md says how)');
}
// The budget: row `js` of mk/artifacts.tsv (artifact, profile, wasm-opt, budget, ...).
const budget = readFileSync(`${ROOT}mk/artifacts.tsv`, 'utf8').split('\n').find((l) => l.startsWith('js\t')).split('\t')[3];
if (wasm) console.log(`wasm: ${wasm} B of ${budget} B`);
if (process.env.BQ_JS_BENCH_JSON) {
  console.log(JSON.stringify({ node: process.version, lines: lines.length, passes, batch: BATCH, wasm, results }));
}
