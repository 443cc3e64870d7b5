// The minimal component from Node through jco (an ES module: "type": "module" in
// your package.json). Transpiled first (scripts/build-component.sh js does it):
//   npx @bytecodealliance/jco transpile target/component/bq_dedupe_minimal.component.wasm \
//     --instantiation async --name bq_dedupe_minimal -o target/component/js-minimal
import { readFile } from 'node:fs/promises';

const dir = process.env.BQ_JCO_DIR ?? new URL('../target/component/js-minimal/', import.meta.url).pathname;
const { instantiate } = await import(`${dir}/bq_dedupe_minimal.js`);
const getCoreModule = async (file) => WebAssembly.compile(await readFile(`${dir}/${file}`));

// jco calls imports synchronously and reads what they return loosely: a Promise
// from `seen` reads as true (a skip: the message acked, never run), a handler
// whose promise rejects as a success. So imports are synchronous, and checked:
// an import fails by throwing a plain value (a store-error `{ kind, message }`,
// a handler's reason string); a thrown Error traps the instance (make a new one).
const checked = (name, f) => (...args) => {
  const answer = f(...args);
  if (answer instanceof Promise) {
    throw { kind: 'internal', message: `${name} returned a Promise: imports are synchronous` };
  }
  return answer;
};
const ids = new Set(); // your store: a Set here, a database in production
const seenSet = {
  seen: checked('seen', (key) => ids.has(key)),
  remember: checked('remember', (key) => { ids.add(key); }),
  forget: checked('forget', (key) => { ids.delete(key); }),
};
const effects = [];
const handler = {
  handle: checked('handle', (envelope) => {
    effects.push(JSON.parse(envelope).meta.id); // your side effect; throw a string to fail
  }),
};

const { consumer } = await instantiate(getCoreModule, {
  'babelqueue:idempotency/seen-set': seenSet,
  'babelqueue:idempotency/handler': handler,
});
const guard = new consumer.Guard({ keyPrefix: '', fingerprint: false }); // throws { payload: store-error } if refused

const body = await readFile(new URL('./minimal-envelope.json', import.meta.url), 'utf8');
// A string JS cannot encode as UTF-8 (a lone surrogate) would reach the component
// as U+FFFD, and two such ids as one: refuse it as poison first.
if (!body.isWellFormed()) throw new Error('not UTF-8 text: poison');
console.log(guard.process(body).tag);                                  // run-ok
console.log(guard.processBatch([body, body]).map((o) => o.tag).join()); // skip,skip
console.log(effects.length);                                           // 1
