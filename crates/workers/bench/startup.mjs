// Benchmark (measures and reports, asserts no timing): the start-up CPU of a
// TypeScript worker that dedupes with @babelqueue/dedupe/workers, beside a
// plain TypeScript Queues consumer with no dedupe, as a user builds them:
// examples/ts-worker copied to a scratch project, the package installed from
// `npm pack`, bundled by wrangler (`deploy --dry-run`), profiled by
// `wrangler check startup` (workerd's start-up phase: module evaluation,
// the wasm module's instantiation) BQ_STARTUP_RUNS times each (default 5).
//
// Reported per worker: the bundle's bytes and gzip -9 bytes (what counts
// against Workers' size limit), and the profile's CPU time (the samples that
// are not idle: compiling and instantiating the wasm module, evaluating the
// JS) of each run. Writes target/bench/ts-startup.md.
import { execFileSync } from "node:child_process";
import { cpSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { gzipSync } from "node:zlib";
import { ROOT } from "../tests/harness.mjs";

const RUNS = Number(process.env.BQ_STARTUP_RUNS ?? 5);
const BIN = path.join(ROOT, "node_modules/.bin");
const ENV = { ...process.env, WRANGLER_SEND_METRICS: "false" };
const run = (cmd, args, cwd) =>
  execFileSync(cmd, args, { cwd, env: ENV, encoding: "utf8", maxBuffer: 64 << 20, stdio: ["ignore", "pipe", "pipe"] });

/** The plain consumer: parse, log, ack; what a TypeScript worker costs alone. */
const PLAIN = `export default {
  async queue(batch: MessageBatch, env: unknown): Promise<void> {
    for (const message of batch.messages) {
      const envelope = typeof message.body === "string" ? JSON.parse(message.body) : message.body;
      console.log(envelope.job, envelope.meta?.id);
      message.ack();
    }
    void env;
  },
} satisfies ExportedHandler;
`;

/** CPU microseconds in a .cpuprofile: the samples not in the (idle) node. */
function cpuMicros(file) {
  const profile = JSON.parse(readFileSync(file, "utf8"));
  const idle = new Set(profile.nodes.filter((n) => n.callFrame.functionName === "(idle)").map((n) => n.id));
  let busy = 0;
  profile.samples.forEach((node, i) => {
    if (!idle.has(node)) busy += profile.timeDeltas[i] ?? 0;
  });
  return { busy, wall: profile.endTime - profile.startTime };
}

/** Bundle bytes and gzip -9 bytes of a `wrangler deploy --dry-run --outdir` output. */
function bundleSize(dir) {
  let raw = 0;
  let gzip = 0;
  for (const f of readdirSync(dir)) {
    const file = path.join(dir, f);
    if (!statSync(file).isFile() || f.endsWith(".map") || f === "README.md") continue;
    const bytes = readFileSync(file);
    raw += bytes.length;
    gzip += gzipSync(bytes, { level: 9 }).length;
  }
  return { raw, gzip };
}

/** In a fresh Node process each run: CPU µs to compile the bundle's .wasm and
 *  to instantiate it (its imports stubbed), V8 as workerd runs it. */
const INSTANTIATE = `
const bytes = require("node:fs").readFileSync(process.argv[1]);
const t0 = process.cpuUsage();
const module = new WebAssembly.Module(bytes);
const t1 = process.cpuUsage(t0);
const imports = {};
for (const { module: m, name, kind } of WebAssembly.Module.imports(module)) {
  imports[m] ??= {};
  imports[m][name] = kind === "function" ? () => {} : kind === "memory" ? new WebAssembly.Memory({ initial: 1 }) : kind === "table" ? new WebAssembly.Table({ initial: 0, element: "anyfunc" }) : new WebAssembly.Global({ value: "i32", mutable: true }, 0);
}
const t2 = process.cpuUsage();
try { new WebAssembly.Instance(module, imports); } catch {}
const t3 = process.cpuUsage(t2);
console.log(JSON.stringify({ compile: t1.user + t1.system, instantiate: t3.user + t3.system }));
`;

function instantiation(outdir) {
  const wasm = readdirSync(outdir).find((f) => f.endsWith(".wasm"));
  if (!wasm) return null;
  const runs = [];
  for (let i = 0; i < RUNS; i++) {
    runs.push(JSON.parse(run(process.execPath, ["-e", INSTANTIATE, path.join(outdir, wasm)], ROOT)));
  }
  return runs;
}

function measure(name, scratch, config) {
  const outdir = path.join(scratch, `dist-${name}`);
  run(path.join(BIN, "wrangler"), ["deploy", "--dry-run", "--config", config, "--outdir", outdir], scratch);
  const size = bundleSize(outdir);
  // `check startup` builds wrangler.toml's worker whatever --config says: it
  // is given the upload bundle itself.
  const bundle = path.join(scratch, `${name}.bundle`);
  run(path.join(BIN, "wrangler"), ["deploy", "--dry-run", "--config", config, "--outfile", bundle], scratch);
  const runs = [];
  for (let i = 0; i < RUNS; i++) {
    const outfile = path.join(scratch, `${name}-${i}.cpuprofile`);
    run(path.join(BIN, "wrangler"), ["check", "startup", "--worker", bundle, "--outfile", outfile], scratch);
    runs.push(cpuMicros(outfile));
    console.error(`${name} run ${i + 1}: ${JSON.stringify(runs.at(-1))}`);
  }
  return { name, size, runs, node: instantiation(outdir) };
}

const packDir = mkdtempSync(path.join(tmpdir(), "bq-startup-tgz-"));
const scratch = mkdtempSync(path.join(tmpdir(), "bq-startup-"));
try {
  run("npm", ["pack", "--pack-destination", packDir], path.join(ROOT, "crates/js"));
  const [tarball] = readdirSync(packDir).filter((f) => f.endsWith(".tgz"));
  cpSync(path.join(ROOT, "examples/ts-worker"), scratch, { recursive: true });
  const pkg = JSON.parse(readFileSync(path.join(scratch, "package.json"), "utf8"));
  delete pkg.devDependencies; // the repository's wrangler builds both
  pkg.dependencies["@babelqueue/dedupe"] = `file:${path.join(packDir, tarball)}`;
  writeFileSync(path.join(scratch, "package.json"), JSON.stringify(pkg, null, 2));
  run("npm", ["install", "--no-audit", "--no-fund", "--offline", "--no-package-lock"], scratch);
  writeFileSync(path.join(scratch, "plain.ts"), PLAIN);
  writeFileSync(
    path.join(scratch, "wrangler.plain.toml"),
    'name = "plain"\nmain = "plain.ts"\ncompatibility_date = "2025-06-01"\n\n[[queues.consumers]]\nqueue = "orders"\n',
  );
  const results = [measure("template", scratch, "wrangler.toml"), measure("plain", scratch, "wrangler.plain.toml")];

  const ms = (us) => (us / 1000).toFixed(2);
  const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
  const mean = (xs) => xs.reduce((a, b) => a + b, 0) / xs.length;
  const rows = results.map(({ name, size, runs, node }) => {
    const busy = runs.map((r) => r.busy);
    const wasm = node
      ? `${ms(median(node.map((r) => r.compile)))} + ${ms(median(node.map((r) => r.instantiate)))}`
      : "no wasm";
    return `| ${name === "template" ? "examples/ts-worker (dedupeQueue, DedupeShard)" : "plain TypeScript consumer, no dedupe"} | ${size.raw.toLocaleString("en")} | ${size.gzip.toLocaleString("en")} (${(size.gzip / 1024).toFixed(1)} KiB) | ${ms(mean(busy))} (${busy.map(ms).join(", ")}) | ${wasm} |`;
  });
  const markdown = `# The TypeScript worker's start-up

\`wrangler check startup\` (workerd's start-up phase), ${RUNS} runs each, on ${process.env.BQ_MACHINE ?? "this machine"}; \
the bundle as \`wrangler deploy --dry-run --outdir\` writes it (its .wasm and .js, source maps left out). \
Reproduce: \`make ts-startup\` (\`node crates/workers/bench/startup.mjs\` after the JS package's build).

| worker | bundle bytes | gzip -9 | start-up CPU, ms: mean (each run) | .wasm compile + instantiate in Node, ms (median) |
|---|---:|---:|---|---:|
${rows.join("\n")}

The start-up CPU is the profile's samples that are not idle; workerd's profile holds only a few \
samples a run, so a run reads 0 or a whole sampling interval: the mean over the runs is the figure. \
The last column times \`new WebAssembly.Module\` and \`new WebAssembly.Instance\` (imports stubbed) \
in a fresh Node ${process.version} process per run, ${RUNS} runs: the same V8 work, without the sampling.
`;
  console.log(markdown);
  mkdirSync(path.join(ROOT, "target/bench"), { recursive: true });
  writeFileSync(path.join(ROOT, "target/bench/ts-startup.md"), markdown);
  writeFileSync(path.join(ROOT, "target/bench/ts-startup.json"), JSON.stringify(results, null, 2));
} finally {
  if (!process.env.BQ_STARTUP_KEEP) rmSync(scratch, { recursive: true, force: true });
  else console.error(`kept ${scratch}`);
  rmSync(packDir, { recursive: true, force: true });
}
