// Benchmark (measures, asserts nothing): the fixture worker's consumer on local
// workerd (Miniflare), fed 10,000 envelopes (20% duplicates) in batches of 100
// straight into queue(), once with the batch RPC and once with a naive
// per-message store adapter (EXAMPLE_NAIVE_STORE=on: seen/claim + remember per
// message). Reports messages/s, store round trips and the ratios, and the worker
// bundle size. Writes target/bench/workers.json.
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import path from "node:path";
import { gzipSync } from "node:zlib";
import { ROOT, envelope, startWorker } from "../tests/harness.mjs";
import { workload } from "./workload.mjs";

const TOTAL = Number(process.env.BQ_BENCH_TOTAL ?? 10_000);
const BATCH = 100;

async function run(mode, handler, batches) {
  const worker = await startWorker({
    vars: {
      EXAMPLE_NAIVE_STORE: mode === "naive" ? "on" : "off",
      EXAMPLE_EFFECT_LOG: handler === "no-op" ? "off" : "on",
    },
  });
  try {
    // Warm-up on ids outside the workload (instantiation, first object, JIT).
    await worker.dispatchQueue([{ id: "w", timestamp: new Date(), attempts: 1, body: envelope("warm-up") }]);
    const warm = await worker.stats();
    const started = process.hrtime.bigint();
    for (const batch of batches) {
      const result = await worker.dispatchQueue(batch);
      if (result.outcome !== "ok") throw new Error(`${mode}: batch outcome ${result.outcome}`);
    }
    const seconds = Number(process.hrtime.bigint() - started) / 1e9;
    const stats = await worker.stats();
    const effects = await worker.effects();
    return {
      mode,
      handler,
      messages: stats.deliveries - warm.deliveries,
      seconds,
      messages_per_second: (stats.deliveries - warm.deliveries) / seconds,
      store_round_trips: stats.store_round_trips - warm.store_round_trips,
      runs: stats.runs - warm.runs,
      skips: stats.skips - warm.skips,
      effects_total: effects.total - (handler === "no-op" ? 0 : 1),
    };
  } finally {
    await worker.dispose();
  }
}

function bundleSize() {
  const wasm = path.join(ROOT, "crates/fixture-worker/build/index_bg.wasm");
  const bytes = readFileSync(wasm);
  return { path: path.relative(ROOT, wasm), bytes: bytes.length, gzip: gzipSync(bytes, { level: 9 }).length };
}

const { batches, unique } = workload(TOTAL, BATCH);
console.log(`workload: ${TOTAL} envelopes, ${unique} distinct meta.id, batches of ${BATCH}`);
// Two handlers: one Durable Object write per run (the fixture worker's effect log, the
// same in both adapters), and no I/O at all (the dedupe path alone).
const results = [];
const ratios = {};
for (const handler of ["effect-log", "no-op"]) {
  const pair = [];
  for (const mode of ["batch-rpc", "naive"]) {
    const r = await run(mode, handler, batches);
    pair.push(r);
    results.push(r);
    console.log(
      `${handler.padEnd(10)} ${mode.padEnd(10)} ${r.messages} msgs in ${r.seconds.toFixed(2)} s = ` +
        `${Math.round(r.messages_per_second)} msgs/s, ${r.store_round_trips} store round trips, ` +
        `${r.runs} runs, ${r.skips} skips, ${r.effects_total} effects recorded`,
    );
  }
  const [batch, naive] = pair;
  ratios[handler] = {
    fewer_round_trips: naive.store_round_trips / batch.store_round_trips,
    throughput: batch.messages_per_second / naive.messages_per_second,
  };
  console.log(
    `${handler.padEnd(10)} batch RPC: ${ratios[handler].fewer_round_trips.toFixed(1)}x fewer store round trips, ` +
      `${ratios[handler].throughput.toFixed(2)}x the throughput`,
  );
}
const bundle = bundleSize();
console.log(`worker bundle: ${bundle.path} ${bundle.bytes} bytes after wasm-opt, ${bundle.gzip} bytes gzip`);
mkdirSync(path.join(ROOT, "target/bench"), { recursive: true });
writeFileSync(
  path.join(ROOT, "target/bench/workers.json"),
  JSON.stringify({ total: TOTAL, unique, batch: BATCH, results, ratios, bundle }, null, 2),
);
