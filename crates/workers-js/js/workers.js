// @babelqueue/dedupe/workers: the package for Cloudflare Workers (workerd).
// wrangler's bundler imports a `.wasm` file as a WebAssembly.Module. The module
// is instantiated once, by the first call or `new` of anything exported here,
// not when the worker's code loads: workerd counts a module's top-level work as
// start-up CPU (`wrangler check startup`), and an isolate that never dedupes
// never pays it. Nothing needs an init step, and a store may still be created at
// module scope (it instantiates the module then).
import wasm from "./bq_dedupe_workers_bg.wasm";
import {
  initSync,
  DedupeShard as DedupeShardGlue,
  DurableObjectStore as DurableObjectStoreGlue,
  KvStore as KvStoreGlue,
  InMemoryStore as InMemoryStoreGlue,
  dedupeQueue as dedupeQueueGlue,
  dedupeQueueD1 as dedupeQueueD1Glue,
  dedupe as dedupeGlue,
  dedupeBatch as dedupeBatchGlue,
  dedupeKey as dedupeKeyGlue,
  forget as forgetGlue,
  validate as validateGlue,
  wrap as wrapGlue,
} from "./bq_dedupe_workers.js";

// After the first, `initSync` returns at once. A module that fails to
// instantiate (a .wasm and a glue of different builds) fails every call after,
// with the first failure: nothing runs on a half-made instance.
let failed;
function ready() {
  if (failed) throw failed;
  try {
    initSync({ module: wasm });
  } catch (cause) {
    failed = new Error("@babelqueue/dedupe/workers: its WebAssembly module could not be instantiated", { cause });
    throw failed;
  }
}

/** `wrapper` with `original`'s arity (its name is the computed key's, below). */
function like(wrapper, original) {
  Object.defineProperty(wrapper, "length", { value: original.length });
  return wrapper;
}

// (The wrappers are marked pure, so a bundler drops those a worker does not
// import, as it drops the glue's.)

/** `f`, the module instantiated first. A module that cannot be instantiated
 * makes the call throw, or, for an `f` that answers a promise (`ASYNC`),
 * rejects that promise, as any failure of an async call does. */
function lazy(f, answersPromise = false) {
  return like(
    {
      [f.name]: function (...args) {
        try {
          ready();
        } catch (failure) {
          if (answersPromise) return Promise.reject(failure);
          throw failure;
        }
        return f.apply(this, args);
      },
    }[f.name],
    f,
  );
}

const ASYNC = true;

/** What a handler's `message.ack()` / `retry()` (or the batch's own) throws. */
function settledByTheConsumer(method) {
  return function () {
    throw new TypeError(
      `${method}() in a dedupe handler: the consumer acks or retries each message by its outcome ` +
        "(Cloudflare keeps a message's first call: an ack() before a failure would lose it, a retry() " +
        "before a success would be recorded done); throw to have it retried",
    );
  };
}

/** Cloudflare's message as the handler sees it: itself (its getters and
 * methods on the real message), but `ack()` and `retry()` throw. */
function handlerView(message) {
  if (message === null || typeof message !== "object") return message;
  return new Proxy(message, {
    get(target, key) {
      if (key === "ack" || key === "retry") return settledByTheConsumer(`message.${key}`);
      const value = Reflect.get(target, key, target);
      return typeof value === "function" ? value.bind(target) : value;
    },
  });
}

/** While `running()`, the batch's own `ackAll()`, `retryAll()` and its
 * messages' `ack()` / `retry()` throw as the view's do (a handler that called
 * them and then failed lost its message, reported `retry`: a trial); they
 * pass through otherwise, for the consumer's own calls, which come after the
 * handlers. Returns what sets them back. */
function guardBatch(batch, running) {
  const undo = [];
  const guard = (target, key, name) => {
    let original;
    let own;
    try {
      original = target[key];
      own = Object.getOwnPropertyDescriptor(target, key);
      if (typeof original !== "function") return;
      Object.defineProperty(target, key, {
        configurable: true,
        writable: true,
        value: function (...args) {
          if (running()) settledByTheConsumer(name)();
          return original.apply(this, args);
        },
      });
    } catch {
      return; // a frozen object, or a hostile one: left as it is
    }
    undo.push(() => (own ? Object.defineProperty(target, key, own) : delete target[key]));
  };
  guard(batch, "ackAll", "batch.ackAll");
  guard(batch, "retryAll", "batch.retryAll");
  try {
    const messages = batch.messages;
    if (Array.isArray(messages)) {
      for (const m of messages) {
        if (m === null || typeof m !== "object") continue;
        guard(m, "ack", "message.ack");
        guard(m, "retry", "message.retry");
      }
    }
  } catch {
    // a hostile batch: what was guarded stays guarded, and is set back
  }
  return () => {
    for (const f of undo) {
      try {
        f();
      } catch {
        // set back what can be
      }
    }
  };
}

/** A queue consumer export whose handler (its third argument) gets
 * [`handlerView`]s of the messages, and during which the batch's own
 * settling methods throw ([`guardBatch`]). */
function guardingHandler(consume) {
  return like(
    {
      [consume.name]: function (batch, env, handler, ...rest) {
        let running = 0;
        const guarded =
          typeof handler === "function"
            ? function (envelope, message, ...more) {
                running += 1;
                const done = () => {
                  running -= 1;
                };
                let result;
                try {
                  result = handler.call(this, envelope, handlerView(message), ...more);
                } catch (e) {
                  done();
                  throw e;
                }
                // Awaited, not chained: a promise's own `then` or `finally`
                // is not called (one that never called back left the guard
                // on and the run read as done: a review).
                return (async () => {
                  try {
                    return await result;
                  } finally {
                    done();
                  }
                })();
              }
            : handler;
        const release = batch !== null && typeof batch === "object" ? guardBatch(batch, () => running > 0) : () => {};
        let consumed;
        try {
          consumed = consume.call(this, batch, env, guarded, ...rest);
        } catch (e) {
          release();
          throw e;
        }
        return Promise.resolve(consumed).finally(release);
      },
    }[consume.name],
    consume,
  );
}

/** A subclass of `C` whose constructor instantiates the module first. */
function lazyClass(C) {
  return like(
    {
      [C.name]: class extends C {
        constructor(...args) {
          ready();
          super(...args);
        }
      },
    }[C.name],
    C,
  );
}

export const DedupeShard = /* @__PURE__ */ lazyClass(DedupeShardGlue);
export const DurableObjectStore = /* @__PURE__ */ lazyClass(DurableObjectStoreGlue);
export const KvStore = /* @__PURE__ */ lazyClass(KvStoreGlue);
export const InMemoryStore = /* @__PURE__ */ lazyClass(InMemoryStoreGlue);
export const dedupeQueue = /* @__PURE__ */ lazy(guardingHandler(dedupeQueueGlue), ASYNC);
export const dedupeQueueD1 = /* @__PURE__ */ lazy(guardingHandler(dedupeQueueD1Glue), ASYNC);
export const dedupe = /* @__PURE__ */ lazy(dedupeGlue, ASYNC);
export const dedupeBatch = /* @__PURE__ */ lazy(dedupeBatchGlue, ASYNC);
export const dedupeKey = /* @__PURE__ */ lazy(dedupeKeyGlue);
export const forget = /* @__PURE__ */ lazy(forgetGlue, ASYNC);
export const validate = /* @__PURE__ */ lazy(validateGlue);
export const wrap = /* @__PURE__ */ lazy(wrapGlue);
