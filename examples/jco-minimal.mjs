// The minimal component from Node through jco (an ES module: "type": "module" in
// your package.json). Transpiled first (scripts/build-component.sh js does it):
//   npx @bytecodealliance/jco transpile target/component/bq_dedupe_minimal.component.wasm \
//     --instantiation async --name bq_dedupe_minimal -o target/component/js-minimal
import { readFile } from 'node:fs/promises';

const dir = process.env.BQ_JCO_DIR ?? new URL('../target/component/js-minimal/', import.meta.url).pathname;
const { instantiate } = await import(`${dir}/bq_dedupe_minimal.js`);
const getCoreModule = async (file) => WebAssembly.compile(await readFile(`${dir}/${file}`));

// jco calls imports synchronously and reads their answers loosely: a Promise, or
// "0", from `seen` reads as true (a skip: the message acked, never run); a handler
// whose promise rejects reads as a success. So imports are synchronous functions
// (an async one is refused here, before its work could start) whose answers are
// checked. An import fails by throwing a plain value: a store error `{ kind,
// message }`, a handler's reason string; a thrown Error traps the instance.
const synchronous = (name, f) => {
  if (f.constructor.name === 'AsyncFunction') throw new TypeError(`${name}: jco calls imports synchronously`);
  return f;
};
const storeImport = (name, f, check = () => true) => {
  synchronous(name, f);
  return (...args) => {
    const answer = f(...args);
    if (typeof answer?.then === 'function' || !check(answer)) {
      throw { kind: 'internal', message: `${name} answered ${typeof answer}: imports are synchronous` };
    }
    return answer;
  };
};
const ids = new Set(); // your store: a Set here, a database in production
const seenSet = {
  seen: storeImport('seen', (key) => ids.has(key), (answer) => typeof answer === 'boolean'),
  remember: storeImport('remember', (key) => { ids.add(key); }),
  forget: storeImport('forget', (key) => { ids.delete(key); }),
};
const effects = [];
const handle = synchronous('handle', (envelope) => {
  effects.push(JSON.parse(envelope).meta.id); // your side effect, done when this returns
});
// The wrapper jco calls (your code is `handle` above): a handler that returns a
// promise has started work it cannot wait for, so it fails (and runs again).
const handler = {
  handle: (envelope) => {
    const answer = handle(envelope);
    if (typeof answer?.then === 'function') throw 'the handler returned a promise: handlers are synchronous';
  },
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
