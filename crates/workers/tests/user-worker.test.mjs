// A worker of a user's own (examples/user-worker, copied verbatim into a crate
// OUTSIDE the workspace, depending on the adapter by path, built with
// worker-build: crates/workers/tests/user-worker-build.sh) on workerd through
// Miniflare, configured from its own wrangler.toml. Every kind of producer
// publishes every envelope twice: one effect per meta.id, no poison.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { tmpdir } from "node:os";
import path from "node:path";
import { Log, LogLevel, Miniflare } from "miniflare";
import { unstable_getMiniflareWorkerOptions } from "wrangler";
import { ROOT, envelope, sleep } from "./harness.mjs";

const SCRATCH = path.join(tmpdir(), "bq-dedupe-user-worker");
let mf;
let crate;
/** What the worker printed (its console.log lines and the adapter's warnings). */
const output = [];

before(async () => {
  crate = execFileSync(path.join(ROOT, "crates/workers/tests/user-worker-build.sh"), [SCRATCH], {
    encoding: "utf8",
    stdio: ["ignore", "pipe", "inherit"],
  }).trim();
  const { workerOptions, main } = unstable_getMiniflareWorkerOptions(
    path.join(crate, "wrangler.toml"),
  );
  const queueConsumers = {};
  for (const [name, options] of Object.entries(workerOptions.queueConsumers)) {
    queueConsumers[name] = { ...options, maxBatchTimeout: 0, retryDelay: 0 };
  }
  mf = new Miniflare({
    ...workerOptions,
    modules: true,
    cf: false,
    scriptPath: main,
    modulesRoot: path.dirname(main), // module names relative to build/, not the cwd
    queueConsumers,
    // Only the consumer of `orders` is configured: catch what reaches the DLQ.
    queueProducers: { ...workerOptions.queueProducers },
    log: new Log(process.env.BQ_WORKER_LOG ? LogLevel.DEBUG : LogLevel.WARN),
    handleRuntimeStdio(stdout, stderr) {
      for (const stream of [stdout, stderr]) {
        let rest = "";
        stream.on("data", (chunk) => {
          const lines = (rest + chunk).split("\n");
          rest = lines.pop();
          output.push(...lines);
        });
      }
    },
  });
  await mf.ready;
});

after(async () => {
  await mf?.dispose();
});

/** The sums of the consumer's per-batch log line. */
function consumed() {
  const sum = { ran: 0, skipped: 0, duplicates: 0, redeliveries: 0 };
  for (const line of output) {
    const m = line.match(/(\d+) ran, (\d+) skipped \((\d+) duplicate publishes, (\d+) redeliveries\)/);
    if (!m) continue;
    sum.ran += Number(m[1]);
    sum.skipped += Number(m[2]);
    sum.duplicates += Number(m[3]);
    sum.redeliveries += Number(m[4]);
  }
  return sum;
}

/** `charge:<meta.id>:<message id>:<attempt>` keys per meta.id: the handler's runs. */
async function charges() {
  const kv = await mf.getKVNamespace("CHARGES");
  const counts = {};
  let cursor;
  do {
    const page = await kv.list({ prefix: "charge:", cursor });
    for (const { name } of page.keys) {
      const rest = name.slice("charge:".length, name.lastIndexOf(":"));
      const id = rest.slice(0, rest.lastIndexOf(":"));
      counts[id] = (counts[id] ?? 0) + 1;
    }
    cursor = page.list_complete ? undefined : page.cursor;
  } while (cursor);
  return counts;
}

async function waitFor(check, what, timeoutMs = 20_000) {
  const deadline = Date.now() + timeoutMs;
  let last;
  while (Date.now() < deadline) {
    last = await charges();
    if (check(last)) return last;
    await sleep(50);
  }
  throw new Error(`timed out waiting for ${what}; charges: ${JSON.stringify(last)}`);
}

async function post(route, body) {
  const res = await mf.dispatchFetch(`http://worker${route}`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  const text = await res.text();
  assert.equal(res.status, 200, `${route}: ${text}`);
  return JSON.parse(text);
}

/** A JS Map holding the envelope, nested objects as Maps too (serde-wasm-bindgen's shape). */
function asMap(value) {
  if (value === null || typeof value !== "object" || Array.isArray(value)) return value;
  return new Map(Object.entries(value).map(([k, v]) => [k, asMap(v)]));
}

test("a user's own worker, built outside the workspace, takes every kind of body once per meta.id", async () => {
  const orders = await mf.getQueueProducer("ORDERS");
  const ids = {
    text: "user-text",
    bytes: "user-bytes",
    object: "user-object",
    v8Map: "user-v8-map",
    sendEnvelopes: "user-send-envelopes",
    sendTyped: "user-send-typed",
  };
  const typed = (id) => ({
    job: "urn:babel:orders:created",
    trace_id: "7b3f9c2a-e41d-4f88-9b2a-1c0d5e6f7a8b",
    data: { order_id: 7 },
    meta: { id, schema_version: 1 },
  });
  for (let round = 0; round < 2; round++) {
    // From JS producers: text, bytes (Uint8Array, DataView, ArrayBuffer), a plain
    // object, and a structured clone of a Map.
    await orders.send(JSON.stringify(envelope(ids.text)), { contentType: "text" });
    const bytes = new TextEncoder().encode(JSON.stringify(envelope(ids.bytes)));
    await orders.send(round === 0 ? bytes : new DataView(bytes.buffer), { contentType: "bytes" });
    // An ArrayBuffer (a structured clone keeps it as one).
    await orders.send(bytes.buffer.slice(0), { contentType: "v8" });
    await orders.send(envelope(ids.object), { contentType: "json" });
    await orders.send(asMap(envelope(ids.v8Map)), { contentType: "v8" });
    // From the Rust producers of the worker: send_envelopes(&[serde_json::Value])
    // and workers-rs queue.send(&Order).
    assert.deepEqual(await post("/publish", [envelope(ids.sendEnvelopes)]), { sent: 1 });
    assert.deepEqual(await post("/publish-typed", typed(ids.sendTyped)), { sent: 1 });
  }
  const want = Object.fromEntries(Object.values(ids).map((id) => [id, 1]));
  const got = await waitFor(
    (c) => Object.values(ids).every((id) => c[id] === 1),
    "one charge per id",
  );
  assert.deepEqual(got, want);
  // Every second publish delivered and skipped as a duplicate: nothing ran
  // twice, nothing was poison (every delivery either ran or was skipped).
  const n = Object.keys(ids).length + 1; // + the ArrayBuffer, an id sent in both kinds
  const deadline = Date.now() + 20_000;
  while (consumed().ran + consumed().skipped < 2 * n && Date.now() < deadline) await sleep(50);
  assert.deepEqual(consumed(), { ran: Object.keys(ids).length, skipped: n + 1, duplicates: n + 1, redeliveries: 0 });
  assert.deepEqual(await charges(), want);
  assert.equal(output.filter((l) => l.includes("bq-dedupe")).length, 0, output.join("\n"));
});

test("a serde map sent with workers-rs Queue::send (a JS Map as json) arrives as {}: dead-lettered, and the log says why", async () => {
  const orders = await mf.getQueueProducer("ORDERS");
  output.length = 0;
  // What serde-wasm-bindgen makes of a serde_json::Value, sent as json.
  await orders.send(asMap(envelope("user-json-map")), { contentType: "json" });
  const deadline = Date.now() + 20_000;
  let warning;
  while (!warning && Date.now() < deadline) {
    warning = output.find((l) => l.includes("bq_dedupe_workers::send_envelope"));
    await sleep(50);
  }
  assert.ok(warning, output.join("\n"));
  assert.match(warning, /the body is \{\}/);
  assert.equal((await charges())["user-json-map"], undefined);
});

test("send_envelopes refuses an envelope over Cloudflare's 128 KB message limit before sending, naming its place (a trial's finding)", async () => {
  const big = envelope("user-too-large");
  big.data.blob = "x".repeat(200_000);
  const res = await mf.dispatchFetch("http://worker/publish", {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify([envelope("user-small-beside"), big]),
  });
  const text = await res.text();
  assert.equal(res.status, 500, text);
  const said = `${text}\n${output.join("\n")}`;
  assert.match(said, /envelope 1 \(from 0\) .*128 KB/, "names the envelope and the limit, not 'Unknown Internal Error'");
  const counts = await charges();
  assert.equal(counts["user-small-beside"], undefined, "nothing of the refused list was sent");
});
