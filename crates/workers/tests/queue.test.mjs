// The Workers adapter on real workerd (Miniflare), driven as queue traffic.
// Each scenario starts its own worker with fresh in-memory state.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import { AUTH, ROOT, envelope, sleep, startWorker, withWorker } from "./harness.mjs";

const manifest = JSON.parse(
  readFileSync(path.join(ROOT, "tests/conformance/manifest.json"), "utf8"),
);

/** Runs `body(worker)` against a fresh worker, always disposing it. */
const delta = (after, before, key) => after[key] - before[key];

describe("conformance sequences as queue traffic", () => {
  for (const sequence of manifest.idempotency.sequences.cases) {
    test(`${sequence.name}: expected_effects = ${sequence.expected_effects}`, () =>
      // No redelivery by the queue itself: each listed delivery is one publish.
      withWorker({ consumer: { maxRetries: 0 } }, async (worker) => {
        for (const [i, delivery] of sequence.deliveries.entries()) {
          if (delivery.forget_before) await worker.forget([delivery.meta_id]);
          const data = delivery.outcome === "throw" ? { always_fail: true } : {};
          const before = await worker.stats();
          const invokedBefore = (await worker.effects()).invocations_total;
          const after = await worker.publishAndWait([envelope(delivery.meta_id, data)]);
          const ran = (await worker.effects()).invocations_total - invokedBefore;
          const skipped = delta(after, before, "skips");
          assert.deepEqual(
            { ran, skipped },
            delivery.expect_effect === "run" ? { ran: 1, skipped: 0 } : { ran: 0, skipped: 1 },
            `delivery ${i} (${JSON.stringify(delivery)})`,
          );
        }
        // The manifest counts every handler invocation (a throw included).
        const effects = await worker.effects();
        assert.equal(effects.invocations_total, sequence.expected_effects);
      }));
  }
});

describe("redeliveries apart from duplicate publishes", () => {
  test("/stats counts Cloudflare redeliveries (attempts > 1) and new messages with a known meta.id apart, through the report and the observers", () =>
    withWorker({}, async (worker) => {
      // One batch: dup-x twice (a duplicate publish in the batch), flaky fails
      // its first attempt (Cloudflare redelivers it: a redelivery, which runs).
      let stats = await worker.publishAndWait(
        [envelope("rd-x"), envelope("rd-x"), envelope("rd-flaky", { fail_attempts: 1 })],
        4,
      );
      assert.equal(stats.deliveries, 4);
      assert.equal(stats.duplicate_publishes, 1, JSON.stringify(stats));
      assert.equal(stats.redeliveries, 1, JSON.stringify(stats));
      // Published again later: new messages whose ids are remembered.
      stats = await worker.publishAndWait([envelope("rd-x"), envelope("rd-flaky")]);
      assert.equal(stats.duplicate_publishes, 3);
      assert.equal(stats.redeliveries, 1);
      assert.equal(stats.skips, 3);
      assert.deepEqual((await worker.effects()).effects, { "rd-flaky": 1, "rd-x": 1 });
      // The guard's observer saw every outcome, the message observer every message.
      assert.equal(stats.observed_outcomes, stats.deliveries);
      assert.equal(stats.observed_messages, stats.deliveries);
    }));
});

describe("duplicate publishes", () => {
  test("in one batch: each meta.id runs once, duplicates are acked as skips", () =>
    withWorker({}, async (worker) => {
      const stats = await worker.publishAndWait([
        envelope("dup-a"),
        envelope("dup-a"),
        envelope("dup-b"),
        envelope("dup-a"),
      ]);
      assert.equal(stats.batches, 1, "one batch");
      assert.equal(stats.runs, 2);
      assert.equal(stats.skips, 2);
      assert.deepEqual((await worker.effects()).effects, { "dup-a": 1, "dup-b": 1 });
    }));

  test("across batches: a re-publish of a processed id is skipped", () =>
    withWorker({}, async (worker) => {
      await worker.publishAndWait([envelope("cross-a")]);
      const stats = await worker.publishAndWait([envelope("cross-a"), envelope("cross-b")]);
      assert.equal(stats.batches, 2);
      assert.equal(stats.skips, 1);
      assert.deepEqual((await worker.effects()).effects, { "cross-a": 1, "cross-b": 1 });
    }));

  test("redelivery storm: one envelope published 50 times runs once", () =>
    withWorker({}, async (worker) => {
      const storm = Array.from({ length: 50 }, () => envelope("storm"));
      const stats = await worker.publishAndWait(storm);
      assert.equal(stats.runs, 1);
      assert.equal(stats.skips, 49);
      const effects = await worker.effects();
      assert.deepEqual(effects.effects, { storm: 1 });
      assert.equal(effects.invocations_total, 1);
    }));

  test("bodies sent as text, bytes and JSON are all decoded", () =>
    withWorker({}, async (worker) => {
      const producer = await worker.mf.getQueueProducer("ORDERS");
      const text = JSON.stringify(envelope("as-text"));
      await producer.send(text, { contentType: "text" });
      await producer.send(new TextEncoder().encode(JSON.stringify(envelope("as-bytes"))), {
        contentType: "bytes",
      });
      await producer.send(envelope("as-json"), { contentType: "json" });
      await producer.send(text, { contentType: "text" }); // a duplicate of the first
      await worker.waitForStats((s) => s.deliveries >= 4, "4 deliveries");
      const effects = await worker.effects();
      assert.deepEqual(effects.effects, { "as-bytes": 1, "as-json": 1, "as-text": 1 });
    }));
});

describe("handler failures", () => {
  test("fails twice then succeeds on Cloudflare's retry: effects = 1 (attempts mapped from 0)", () =>
    withWorker({ consumer: { maxRetries: 3 } }, async (worker) => {
      await worker.publish([envelope("flaky", { fail_attempts: 2 })]);
      const stats = await worker.waitForStats((s) => s.runs >= 1, "the successful run");
      assert.equal(stats.failures, 2, "attempts 0 and 1 failed");
      assert.equal(stats.deliveries, 3);
      const effects = await worker.effects();
      assert.deepEqual(effects.effects, { flaky: 1 });
      assert.deepEqual(effects.invocations, { flaky: 3 });
      // Remembered now: a re-publish is skipped.
      const after = await worker.publishAndWait([envelope("flaky", { fail_attempts: 2 })]);
      assert.equal(after.skips, 1);
    }));

  test("an in-batch duplicate of a failed delivery is retried with it, not parked for DEDUPE_PARK_DELAY_SECONDS (a trial's finding)", () =>
    withWorker({}, async (worker) => {
      const copy = (msgId) => ({ id: msgId, timestamp: new Date(), attempts: 1, body: envelope("twin", { fail_attempts: 1 }) });
      const result = await worker.dispatchQueue([copy("twin-a"), copy("twin-b")]);
      const retried = Object.fromEntries(result.retryMessages.map((m) => [m.msgId, m.delaySeconds ?? 0]));
      assert.deepEqual(Object.keys(retried).sort(), ["twin-a", "twin-b"], JSON.stringify(result));
      assert.ok(retried["twin-b"] <= 1, `the copy waits at most a second, as its leader: ${JSON.stringify(result)}`);
      assert.deepEqual((await worker.effects()).effects, {}, "nothing ran to success");
    }));

  test("fails until max_retries: dead-lettered with reason failed and the error, id never remembered", () =>
    withWorker({ vars: { DEDUPE_MAX_RETRIES: "2" }, consumer: { maxRetries: 2 } }, async (worker) => {
      await worker.publish([envelope("doomed", { always_fail: true }), envelope("fine")]);
      const stats = await worker.waitForStats(
        (s) => s.dead_letters_received >= 1,
        "the dead letter",
      );
      assert.equal(stats.failures, 3, "first delivery + 2 retries");
      assert.equal(stats.dead_lettered, 1, "the consumer sent it, on the last attempt");
      assert.equal(stats.runs, 1, "the other message in the batch was unaffected");
      const { dead_letters } = await worker.deadLetters();
      assert.equal(dead_letters.length, 1);
      assert.equal(dead_letters[0].meta.id, "doomed");
      assert.equal(dead_letters[0].dead_letter.reason, "failed");
      assert.equal(dead_letters[0].dead_letter.attempts, 3);
      assert.match(dead_letters[0].dead_letter.error, /told to fail \(attempt 2\)/);
      assert.deepEqual((await worker.seen(["doomed", "fine"])).seen, [false, true]);
      assert.deepEqual((await worker.effects()).effects, { fine: 1 });
    }));

  test("fails until max_retries without DEDUPE_MAX_RETRIES: the queue's own DLQ takes it unwrapped", () =>
    withWorker({ vars: { DEDUPE_MAX_RETRIES: "" }, consumer: { maxRetries: 1 } }, async (worker) => {
      await worker.publish([envelope("doomed-raw", { always_fail: true })]);
      const stats = await worker.waitForStats((s) => s.dead_letters_received >= 1, "the DLQ");
      assert.equal(stats.failures, 2);
      assert.equal(stats.dead_lettered, 0);
      const [letter] = (await worker.deadLetters()).dead_letters;
      assert.equal(letter.meta.id, "doomed-raw");
      assert.equal(letter.dead_letter, undefined, "moved by the queue, as published");
      assert.deepEqual((await worker.seen(["doomed-raw"])).seen, [false]);
    }));

  test("a handler that panics on every attempt: a delivered-again batch records each success before the next handler, so one runs at most once more; a first attempt's messages run before the retried (a trial's finding)", () =>
    withWorker({ vars: { DEDUPE_CLAIMING: "off" } }, async (worker) => {
      const msg = (id, body, attempts) => ({ id, timestamp: new Date(), attempts, body });
      const batch = (attempts) => [
        msg(`ok-${attempts}`, envelope("ran-before-the-crash"), attempts),
        msg(`panic-${attempts}`, envelope("crashes-always", { panic: true }), attempts),
      ];
      await worker.dispatchQueue(batch(1)); // the instance aborts: nothing recorded
      await worker.dispatchQueue(batch(2)); // delivered again: the success recorded first
      await worker.dispatchQueue(batch(3));
      await worker.dispatchQueue(batch(4));
      const { invocations } = await worker.effects();
      assert.equal(invocations["ran-before-the-crash"], 2, `at most once more, not on every attempt: ${JSON.stringify(invocations)}`);
      // A first attempt beside a retried crasher: the fresh one is recorded before the crasher runs.
      await worker.dispatchQueue([
        msg("crasher-5", envelope("crashes-always", { panic: true }), 5),
        msg("fresh-1", envelope("fresh-beside-a-crasher"), 1),
      ]);
      assert.deepEqual((await worker.seen(["fresh-beside-a-crasher"])).seen, [true]);
    }));

  test("copies of one id in a batch stay one batch when some were delivered again: the first runs, the others follow it (a review's finding)", () =>
    withWorker({}, async (worker) => {
      const msg = (id, body, attempts) => ({ id, timestamp: new Date(), attempts, body });
      await worker.dispatchQueue([
        msg("copy-again", envelope("copied"), 2),
        msg("copy-fresh", envelope("copied"), 1),
        msg("other-again", envelope("alone-again"), 2),
      ]);
      const stats = await worker.stats();
      assert.deepEqual((await worker.effects()).effects, { copied: 1, "alone-again": 1 });
      assert.equal(stats.duplicate_publishes, 1, `the fresh copy followed the first: ${JSON.stringify(stats)}`);
    }));

  test("a crasher with a copy in its batch runs after the other messages delivered again, not before them (a review's finding)", () =>
    withWorker({ vars: { DEDUPE_CLAIMING: "off" } }, async (worker) => {
      const msg = (id, body, attempts) => ({ id, timestamp: new Date(), attempts, body });
      await worker.dispatchQueue([
        msg("before-again", envelope("recorded-before-the-crash"), 2),
        msg("crasher-a", envelope("crashes-with-a-copy", { panic: true }), 2),
        msg("crasher-b", envelope("crashes-with-a-copy", { panic: true }), 2),
      ]);
      assert.deepEqual((await worker.seen(["recorded-before-the-crash"])).seen, [true]);
    }));

  test("a panicking handler: nothing acked or remembered; its claims block until the lease ends", () =>
    // (A 3 s lease: at 1 s the rebuilt instance's first calls on a loaded
    // machine could outlast it before the redelivery that must park: a review.)
    withWorker({ vars: { DEDUPE_CLAIM_LEASE_SECONDS: "3" } }, async (worker) => {
      const msg = (id, body) => ({ id, timestamp: new Date(), attempts: 1, body });
      const crashed = await worker.dispatchQueue([
        msg("q-ok", envelope("before-crash")),
        msg("q-panic", envelope("crasher", { panic: true })),
      ]);
      // The aborted instance never settles the invocation; workerd cancels it.
      assert.notEqual(crashed.outcome, "ok", JSON.stringify(crashed));
      assert.deepEqual(crashed.explicitAcks, [], "nothing acked: the runtime retries both");
      assert.deepEqual((await worker.seen(["before-crash", "crasher"])).seen, [false, false]);
      // The crashed invocation's claims still hold: a redelivery parks until the lease ends.
      const blocked = await worker.dispatchQueue([msg("q-ok-1", envelope("before-crash"))]);
      assert.deepEqual(blocked.retryMessages.map((m) => m.msgId), ["q-ok-1"], JSON.stringify(blocked));
      await sleep(3100);
      // Then the (rebuilt) instance runs it and remembers it.
      const next = await worker.dispatchQueue([msg("q-ok-2", envelope("before-crash"))]);
      assert.equal(next.outcome, "ok", JSON.stringify(next));
      assert.deepEqual(next.explicitAcks, ["q-ok-2"], JSON.stringify(next));
      assert.deepEqual((await worker.seen(["before-crash"])).seen, [true]);
    }));
});

describe("poison (malformed or invalid envelopes)", () => {
  test("with a dead-letter producer: wrapped with dead_letter {reason: poison} and acked", () =>
    withWorker({}, async (worker) => {
      const invalid = envelope("bad-schema");
      invalid.meta.schema_version = 2;
      const stats = await worker.publishAndWait(["{not json", invalid, envelope("good")]);
      assert.equal(stats.poison, 2);
      assert.equal(stats.dead_lettered, 2);
      assert.equal(stats.runs, 1);
      const done = await worker.waitForStats((s) => s.dead_letters_received >= 2, "dead letters");
      assert.equal(done.deliveries, 3, "acked, not redelivered");
      const { dead_letters } = await worker.deadLetters();
      const byBody = dead_letters.find((d) => d.body === "{not json");
      assert.ok(byBody, JSON.stringify(dead_letters));
      assert.equal(byBody.dead_letter.reason, "poison");
      assert.equal(byBody.dead_letter.original_queue, "bq-orders");
      const wrapped = dead_letters.find((d) => d.meta?.id === "bad-schema");
      assert.equal(wrapped.dead_letter.reason, "poison");
      assert.equal(wrapped.meta.schema_version, 2, "the envelope is kept as it was");
    }));

  test("a poison message near the queue's 128 KB limit is dead-lettered with its block, within the limit (issue #29)", () =>
    withWorker({ consumer: { maxRetries: 1 } }, async (worker) => {
      const big = envelope("big-poison", { pad: "x".repeat(127_300) });
      big.meta.schema_version = 2;
      const stats = await worker.publishAndWait([big]);
      assert.equal(stats.poison, 1);
      assert.equal(stats.dead_lettered, 1, JSON.stringify(stats));
      await worker.waitForStats((s) => s.dead_letters_received >= 1, "the dead letter");
      const [letter] = (await worker.deadLetters()).dead_letters;
      assert.equal(letter.dead_letter?.reason, "poison", "sent by the consumer, with its block");
      assert.equal(letter.meta.id, "big-poison");
      assert.equal(letter.job, big.job);
      assert.ok(letter.truncated?.bytes > 127_300, JSON.stringify(letter).slice(0, 300));
      assert.ok(JSON.stringify(letter).length <= 128_000);
    }));

  // The numbers in `data` (which a cut letter drops), or in `meta` (which it
  // keeps: its cut form was measured with serde_json, fit there and was
  // refused by the queue on every attempt: a review).
  for (const where of ["data", "meta"]) test(`a dead letter is measured as the runtime encodes it: numbers JS writes longer in ${where} still fit (review)`, () =>
    withWorker({ consumer: { maxRetries: 1 } }, async (worker) => {
      // 20,000 x `1e20`: 100 KB as sent, 440 KB as JSON.stringify writes it.
      const n = `"n":[${Array(20_000).fill("1e20").join(",")}]`;
      const raw = where === "data"
        ? `{"job":"urn:babel:orders:created","trace_id":"t","data":{${n}},"meta":{"id":"wide-numbers","schema_version":2}}`
        : `{"job":"urn:babel:orders:created","trace_id":"t","data":{},"meta":{"id":"wide-numbers","schema_version":2,${n}}}`;
      const stats = await worker.publishAndWait([raw]);
      assert.equal(stats.dead_lettered, 1, JSON.stringify(stats));
      await worker.waitForStats((s) => s.dead_letters_received >= 1, "the dead letter");
      const [letter] = (await worker.deadLetters()).dead_letters;
      assert.equal(letter.dead_letter?.reason, "poison");
      assert.equal(letter.meta.id, "wide-numbers");
      assert.ok(letter.truncated?.bytes === raw.length, JSON.stringify(letter).slice(0, 300));
    }));

  test("a structured-clone body no UTF-8 text holds whole is dead-lettered as the value itself (review)", () =>
    withWorker({ consumer: { maxRetries: 1 } }, async (worker) => {
      // A BigInt JSON cannot write (its text was empty: the letter's body was
      // "") and bytes that are not UTF-8 (the letter had U+FFFD for them). A
      // string with a lone surrogate takes the same path, but the local queue
      // hands it over with U+FFFD already.
      const orders = await worker.mf.getQueueProducer("ORDERS");
      const bigint = envelope("v8-bigint", { amount: 10n });
      await orders.send(bigint, { contentType: "v8" });
      await orders.send(new Uint8Array([0x7b, 0xff, 0xfe]), { contentType: "v8" });
      const stats = await worker.waitForStats((s) => s.dead_letters_received >= 2, "two dead letters");
      assert.equal(stats.poison, 2, JSON.stringify(stats));
      assert.equal(stats.runs, 0);
      const letters = (await worker.deadLetters()).dead_letters;
      const big = letters.find((l) => l.body?.meta?.id === "v8-bigint");
      assert.ok(big, JSON.stringify(letters));
      assert.equal(big.body.data.amount, "10n", "the value whole (the log writes a BigInt as a string)");
      assert.equal(big.dead_letter.reason, "poison");
      assert.equal(big.dead_letter.exception, "not-json");
      const bytes = letters.find((l) => l.body?.[0] === 0x7b);
      assert.deepEqual(bytes?.body, { 0: 0x7b, 1: 0xff, 2: 0xfe }, JSON.stringify(letters));
      assert.equal(bytes.dead_letter.exception, "not-json");
    }));

  test("binary poison near the size limit, too large as a structured-clone letter: the JSON letter with its digest (a review's finding)", () =>
    withWorker({ consumer: { maxRetries: 1 } }, async (worker) => {
      const orders = await worker.mf.getQueueProducer("ORDERS");
      await orders.send(new Uint8Array(127_950).fill(0xff), { contentType: "v8" });
      await worker.waitForStats((s) => s.dead_letters_received >= 1, "the dead letter");
      const [letter] = (await worker.deadLetters()).dead_letters;
      assert.equal(letter.dead_letter?.reason, "poison", JSON.stringify(letter).slice(0, 300));
      assert.equal(letter.truncated?.bytes, 127_950);
      assert.match(letter.truncated?.sha256 ?? "", /^[0-9a-f]{64}$/);
      // Its digest, never its text (U+FFFD is not the body), saying why.
      assert.match(letter.truncated?.why ?? "", /refused it as a structured clone/);
      assert.equal(letter.body, undefined);
    }));

  test("DEDUPE_DEAD_LETTER naming the queue it reads: a letter that comes back counts its laps, and after five is retried until the queue moves it (a trial: it went round for ever)", () =>
    withWorker({ vars: { DEDUPE_DEAD_LETTER: "ORDERS" }, consumer: { maxRetries: 2 } }, async (worker) => {
      await worker.publish(["{not json"]);
      const stats = await worker.waitForStats((s) => s.dead_letters_received >= 1, "the queue's own DLQ");
      assert.equal(stats.dead_lettered, 5, JSON.stringify(stats));
      assert.equal(stats.poison, 8, "the body and four letters once, the fifth three times: " + JSON.stringify(stats));
      const [letter] = (await worker.deadLetters()).dead_letters;
      assert.equal(letter.dead_letter?.reason, "poison", JSON.stringify(letter).slice(0, 300));
      assert.equal(letter.dead_letter?.laps, 5);
    }));

  test("a letter JSON cannot write (a structured clone holding a BigInt) counts its laps too (a review: they read 0, and it went round until the queue refused its size)", () =>
    withWorker({ vars: { DEDUPE_DEAD_LETTER: "ORDERS" }, consumer: { maxRetries: 2 } }, async (worker) => {
      const orders = await worker.mf.getQueueProducer("ORDERS");
      await orders.send(envelope("laps-bigint", { amount: 10n }), { contentType: "v8" });
      const stats = await worker.waitForStats((s) => s.dead_letters_received >= 1, "the queue's own DLQ");
      assert.equal(stats.dead_lettered, 5, JSON.stringify(stats));
    }));

  test("a binary body whose letter comes round again keeps its bytes in every lap (a review: the second lap's letter said \"body\": {})", () =>
    withWorker({ vars: { DEDUPE_DEAD_LETTER: "ORDERS" }, consumer: { maxRetries: 2 } }, async (worker) => {
      const orders = await worker.mf.getQueueProducer("ORDERS");
      await orders.send(new Uint8Array([0x7b, 0xff, 0xfe]).buffer, { contentType: "v8" });
      const stats = await worker.waitForStats((s) => s.dead_letters_received >= 1, "the queue's own DLQ");
      assert.equal(stats.dead_lettered, 5, JSON.stringify(stats));
      const [letter] = (await worker.deadLetters()).dead_letters;
      assert.equal(letter.dead_letter?.laps, 5, JSON.stringify(letter).slice(0, 600));
      // Each lap's letter holds the one before as its body, the bytes last.
      let inner = letter;
      while (inner?.body && !inner.body.array_buffer) inner = inner.body;
      assert.deepEqual(inner?.body?.array_buffer, [0x7b, 0xff, 0xfe], JSON.stringify(letter).slice(0, 600));
    }));

  test("a whole letter sent back (a redrive as docs/workers.md shows) that fails again is dead-lettered again, its laps counted (a review)", () =>
    withWorker({ vars: { DEDUPE_MAX_RETRIES: "1" }, consumer: { maxRetries: 1 } }, async (worker) => {
      const block = { reason: "failed", failed_at: 1, original_queue: "bq-orders", attempts: 1 };
      await worker.publish([{ ...envelope("redriven", { always_fail: true }), dead_letter: block }]);
      const stats = await worker.waitForStats((s) => s.dead_letters_received >= 1, "the letter");
      assert.equal(stats.dead_lettered, 1, JSON.stringify(stats));
      const [again] = (await worker.deadLetters()).dead_letters;
      assert.equal(again.dead_letter?.laps, 2, JSON.stringify(again).slice(0, 300));
    }));

  test("without one: retried, so the queue's max_retries + dead_letter_queue take it", () =>
    withWorker({ vars: { DEDUPE_DEAD_LETTER: "" }, consumer: { maxRetries: 1 } }, async (worker) => {
      await worker.publish(["{not json"]);
      const stats = await worker.waitForStats((s) => s.dead_letters_received >= 1, "the DLQ");
      assert.equal(stats.poison, 2, "delivered, retried once, then moved by the queue");
      assert.equal(stats.dead_lettered, 0);
      const { dead_letters } = await worker.deadLetters();
      assert.equal(dead_letters[0], "{not json", "the raw body reached the DLQ");
    }));
});

describe("ids", () => {
  for (const store of ["durable-object", "kv"]) {
    test(`10 KB, unicode and __proto__ ids dedupe exactly (${store} store)`, () =>
      withWorker(
        { vars: { DEDUPE_STORE: store, DEDUPE_CLAIMING: store === "kv" ? "off" : "on" } },
        async (worker) => {
          const long = "x".repeat(10 * 1024);
          const longer = long + "y"; // differs only past 10 KB
          const unicode = "заказ-🚀-東京-\u0000-\u{10FFFF}";
          // (workerd's KV bulk get leaves `__proto__` out of its answer: a
          // trial's id ran twice.)
          const proto = "__proto__";
          await worker.publishAndWait([envelope(long), envelope(unicode), envelope(longer), envelope(proto)]);
          const stats = await worker.publishAndWait([envelope(long), envelope(unicode), envelope(proto)]);
          assert.equal(stats.skips, 3);
          const effects = await worker.effects();
          assert.equal(effects.effects[long], 1);
          assert.equal(effects.effects[longer], 1);
          assert.equal(effects.effects[unicode], 1);
          assert.equal(Object.getOwnPropertyDescriptor(effects.effects, proto)?.value, 1);
        },
      ));
  }

  test("ids KV cannot name (\".\", \"..\") are stored hashed and do not fail their batch", () =>
    withWorker({ vars: { DEDUPE_STORE: "kv", DEDUPE_CLAIMING: "off" } }, async (worker) => {
      await worker.publishAndWait([envelope("."), envelope(".."), envelope("plain")]);
      const stats = await worker.publishAndWait([envelope("."), envelope(".."), envelope("plain")]);
      assert.equal(stats.store_errors, 0, JSON.stringify(stats));
      assert.equal(stats.skips, 3);
      assert.deepEqual((await worker.effects()).effects, { ".": 1, "..": 1, plain: 1 });
    }));

  test("no usable meta.id fails open: every delivery runs", () =>
    withWorker({}, async (worker) => {
      const stats = await worker.publishAndWait([envelope(undefined), envelope(""), envelope("")]);
      assert.equal(stats.fail_open, 3);
      assert.equal((await worker.effects()).total, 3);
    }));
});

describe("concurrency", () => {
  const racers = (n) =>
    Array.from({ length: n }, (_, i) => [
      { id: `race-${i}`, timestamp: new Date(), attempts: 1, body: envelope("raced", { sleep_ms: 300 }) },
    ]);

  test("claiming on: 5 concurrent queue() invocations with the same id -> exactly one effect", () =>
    withWorker({ vars: { DEDUPE_CLAIMING: "on" } }, async (worker) => {
      const results = await Promise.all(racers(5).map((batch) => worker.dispatchQueue(batch)));
      assert.ok(results.every((r) => r.outcome === "ok"), JSON.stringify(results));
      const effects = await worker.effects();
      assert.deepEqual(effects.effects, { raced: 1 });
      assert.equal(effects.invocations_total, 1);
      const stats = await worker.stats();
      assert.equal(stats.runs, 1);
      assert.equal(stats.parked + stats.skips, 4, "the losers parked (retried) or skipped");
      const retried = results.flatMap((r) => r.retryMessages);
      assert.equal(retried.length, stats.parked, "every parked message was retried, none acked");
      // The holder's claim (120 s) has about that long left: parked just past it.
      assert.ok(
        retried.every((m) => m.delaySeconds >= 119 && m.delaySeconds <= 121),
        `parked messages wait until the holder's claim ends: ${JSON.stringify(retried)}`,
      );
    }));

  test("claiming off: the same race runs the handler more than once (why claiming exists)", () =>
    withWorker({ vars: { DEDUPE_CLAIMING: "off" } }, async (worker) => {
      await Promise.all(racers(5).map((batch) => worker.dispatchQueue(batch)));
      const effects = await worker.effects();
      assert.ok(effects.effects.raced > 1, JSON.stringify(effects));
    }));
});

describe("TTL", () => {
  test("Durable Object store: an id remembered with a 3 s TTL is skipped before and runs after expiry", () =>
    // 3 s, not 1 s: a loaded machine took over 1 s between the remember and the second consume.
    withWorker({ vars: { DEDUPE_TTL_SECONDS: "3" } }, async (worker) => {
      await worker.publishAndWait([envelope("ttl")]);
      const early = await worker.publishAndWait([envelope("ttl")]);
      assert.equal(early.skips, 1);
      await sleep(3200);
      const late = await worker.publishAndWait([envelope("ttl")]);
      assert.equal(late.runs, 2);
      assert.deepEqual((await worker.effects()).effects, { ttl: 2 });
    }));

  test("Durable Object store: the alarm sweeps expired rows out of storage", () =>
    withWorker({ vars: { DEDUPE_TTL_SECONDS: "1" } }, async (worker) => {
      await worker.publishAndWait([envelope("swept-a"), envelope("swept-b")]);
      const stored = await worker.request("GET", "/store/entries?expired=1");
      assert.equal(stored.entries.length, 2);
      assert.ok(stored.entries.every((e) => e.state === "done" && e.expires_at > Date.now() - 5000));
      const deadline = Date.now() + 10_000;
      let left;
      do {
        await sleep(200);
        left = (await worker.request("GET", "/store/entries?expired=1")).entries;
      } while (left.length > 0 && Date.now() < deadline);
      assert.deepEqual(left, [], "rows past expires_at are deleted by the alarm");
    }));

  for (const name of ["DEDUPE_TTL_SECOND", "dedupe_store", "DEDUP_CLAIMING"]) {
    test(`a misspelt setting (${name}) is refused, naming it, not ignored (trials' findings)`, () =>
      withWorker({ vars: { [name]: "60" } }, async (worker) => {
        const res = await worker.mf.dispatchFetch("http://worker/store/seen", {
          method: "POST",
          headers: AUTH,
          body: JSON.stringify({ keys: ["k"] }),
        });
        assert.equal(res.status, 500);
        assert.match(await res.text(), new RegExp(`${name} is no setting.*DEDUPE_TTL_SECONDS`));
      }));
  }

  test("KV store: a TTL under 60 s is refused with a clear error", () =>
    withWorker(
      { vars: { DEDUPE_STORE: "kv", DEDUPE_CLAIMING: "off", DEDUPE_TTL_SECONDS: "5" } },
      async (worker) => {
        const res = await worker.mf.dispatchFetch("http://worker/store/seen", {
          method: "POST",
          headers: AUTH,
          body: JSON.stringify({ keys: ["k"] }),
        });
        assert.equal(res.status, 500);
        assert.match(await res.text(), /60 s/);
      },
    ));

  test(
    "KV store: an id remembered with the 60 s minimum TTL runs again after expiry",
    { skip: process.env.BQ_SLOW_TESTS ? false : "slow (61 s): set BQ_SLOW_TESTS=1" },
    () =>
      withWorker(
        { vars: { DEDUPE_STORE: "kv", DEDUPE_CLAIMING: "off", DEDUPE_TTL_SECONDS: "60" } },
        async (worker) => {
          await worker.publishAndWait([envelope("kv-ttl")]);
          await sleep(61_000);
          const late = await worker.publishAndWait([envelope("kv-ttl")]);
          assert.equal(late.runs, 2);
        },
      ),
  );
});

describe("store round trips", () => {
  const hundred = (tag) => Array.from({ length: 100 }, (_, i) => envelope(`${tag}-${i}`));

  // Each isolate's first call also asks the layout registry once (a third
  // request, not one per batch): the second batch shows the steady cost.
  test("a batch of 100 distinct envelopes costs 2 Durable Object requests (1 shard)", () =>
    withWorker({}, async (worker) => {
      const stats = await worker.publishAndWait(hundred("rt1"));
      assert.equal(stats.batches, 1);
      assert.equal(stats.runs, 100);
      assert.equal(stats.store_round_trips, 2 + 1);
      const next = await worker.publishAndWait(hundred("rt1-next"));
      assert.equal(next.runs, 200);
      assert.equal(next.store_round_trips - stats.store_round_trips, 2);
    }));

  test("with 4 shards: at most 2 requests per shard touched", () =>
    withWorker({ vars: { DEDUPE_SHARDS: "4" } }, async (worker) => {
      const stats = await worker.publishAndWait(hundred("rt4"));
      assert.equal(stats.batches, 1);
      assert.equal(stats.runs, 100);
      assert.ok(stats.store_round_trips <= 8 + 1, JSON.stringify(stats));
      assert.ok(stats.store_round_trips >= 2 + 1, JSON.stringify(stats));
      // Every shard holds some of 100 ids; together they hold all of them.
      const res = await worker.request("GET", "/store/entries");
      assert.equal(res.entries.length, 100);
    }));

  test("vars written without quotes (numbers, booleans) are honoured", () =>
    withWorker({ vars: { DEDUPE_SHARDS: 4, DEDUPE_CLAIMING: false } }, async (worker) => {
      const stats = await worker.publishAndWait(hundred("unquoted"));
      assert.equal(stats.runs, 100);
      // 4 shards (each asked once to check, once to commit), not the default 1.
      assert.ok(stats.store_round_trips > 2 + 1 && stats.store_round_trips <= 8 + 1, JSON.stringify(stats));
      const claims = await worker.request("POST", "/store/claim", { keys: ["x"], lease_ms: 1000 });
      assert.equal(claims.claims[0].state, "acquired", "the store still claims on request");
    }));

  test("the naive per-message adapter makes 2 requests per message (the baseline)", () =>
    withWorker({ vars: { EXAMPLE_NAIVE_STORE: "on" } }, async (worker) => {
      const stats = await worker.publishAndWait(hundred("naive"));
      assert.equal(stats.runs, 100);
      assert.equal(stats.store_round_trips, 200 + 1);
    }));
});

describe("HTTP surface", () => {
  let worker;
  before(async () => {
    worker = await startWorker();
  });
  after(() => worker.dispose());

  test("POST /publish rejects a non-array body with 400", async () => {
    const res = await worker.mf.dispatchFetch("http://worker/publish", {
      method: "POST",
      headers: AUTH,
      body: JSON.stringify({ not: "an array" }),
    });
    assert.equal(res.status, 400);
  });

  test("POST /publish sends more than 100 items in chunks", async () => {
    const items = Array.from({ length: 250 }, (_, i) => envelope(`chunk-${i}`));
    assert.deepEqual(await worker.publish(items), { sent: 250 });
    await worker.waitForStats((s) => s.deliveries >= 250, "250 deliveries");
  });

  test("/store/forget drops an exact key; /forget namespaces meta.ids like the consumer", () =>
    withWorker({ vars: { DEDUPE_KEY_PREFIX: "tenant-1:" } }, async (prefixed) => {
      await prefixed.publishAndWait([envelope("f-1")]);
      assert.deepEqual((await prefixed.seen(["tenant-1:f-1", "f-1"])).seen, [true, false]);
      await prefixed.request("POST", "/store/forget", { keys: ["tenant-1:f-1"] });
      assert.deepEqual((await prefixed.seen(["tenant-1:f-1"])).seen, [false]);
      await prefixed.publishAndWait([envelope("f-1")]);
      await prefixed.forget(["f-1"]);
      assert.deepEqual((await prefixed.seen(["tenant-1:f-1"])).seen, [false]);
      assert.deepEqual((await prefixed.effects()).effects, { "f-1": 2 });
    }));

  test("a shard request that fails halfway is rolled back: no claim is left behind", () =>
    // SQLite in a Durable Object refuses a value over 2 MB: the second key fails
    // after the first was claimed in the same request (bodies allowed up to 8 MiB).
    withWorker({ vars: { EXAMPLE_MAX_BODY_BYTES: String(8 << 20) } }, async (big) => {
      const res = await big.mf.dispatchFetch("http://worker/store/claim", {
        method: "POST",
        headers: AUTH,
        body: JSON.stringify({ keys: ["rollback-1", "k".repeat(3 * 1024 * 1024)], lease_ms: 60000 }),
      });
      assert.equal(res.status, 503, await res.text());
      const retry = await big.request("POST", "/store/claim", { keys: ["rollback-1"], lease_ms: 60000 });
      assert.equal(retry.claims[0].state, "acquired", "the first key's claim was rolled back");
    }));

  test("/store/claim then /store/release round-trips a claim", async () => {
    const claimed = await worker.request("POST", "/store/claim", { keys: ["c1"], lease_ms: 60000 });
    assert.equal(claimed.claims[0].state, "acquired");
    const again = await worker.request("POST", "/store/claim", { keys: ["c1"], lease_ms: 60000 });
    assert.equal(again.claims[0].state, "held");
    await worker.request("POST", "/store/release", {
      releases: [{ key: "c1", token: claimed.claims[0].token }],
    });
    const free = await worker.request("POST", "/store/claim", { keys: ["c1"], lease_ms: 60000 });
    assert.equal(free.claims[0].state, "acquired");
  });
});

describe("static assets", () => {
  test("the playground (www/) is served at / beside the API routes", () =>
    withWorker({ assets: true }, async (worker) => {
      const page = await worker.mf.dispatchFetch("http://worker/");
      assert.equal(page.status, 200);
      assert.match(await page.text(), /Run conformance/);
      const stats = await worker.stats(); // a route, not an asset
      assert.equal(stats.deliveries, 0);
    }));
});
