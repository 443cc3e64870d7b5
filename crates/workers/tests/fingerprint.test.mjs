// Payload fingerprints (DEDUPE_FINGERPRINT=on) on real workerd (Miniflare),
// through the fixture worker's queue: an id reused with other data is
// dead-lettered as payload-mismatch and never run; a redelivery is a skip.
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { describe, test } from "node:test";
import { envelope, withWorker } from "./harness.mjs";

describe("payload fingerprints", () => {
  // With shards the marker and record sit in their id's object (one request,
  // one transaction: split across objects, a reader between the parts saw
  // the marker without the record, a mismatch for the same payload: a review).
  for (const shards of ["1", "4"]) test(`on, ${shards} shard(s): same id + same data -> skip; same id + other data -> dead-lettered payload-mismatch, not run`, () =>
    withWorker({ vars: { DEDUPE_FINGERPRINT: "on", DEDUPE_SHARDS: shards } }, async (worker) => {
      await worker.publishAndWait([envelope("fp-order", { total: 10 })]);
      // The same payload with its keys in another order: a redelivery.
      const { order_id, ...rest } = envelope("fp-order", { total: 10 }).data;
      const reordered = envelope("fp-order");
      reordered.data = { ...rest, order_id };
      let stats = await worker.publishAndWait([reordered]);
      assert.equal(stats.skips, 1, JSON.stringify(stats));

      await worker.publish([envelope("fp-order", { total: 99 })]);
      stats = await worker.waitForStats((s) => s.dead_letters_received >= 1, "the dead letter");
      assert.equal(stats.runs, 1, "only the first delivery ran");
      assert.equal(stats.poison, 1, JSON.stringify(stats));
      const [letter] = (await worker.deadLetters()).dead_letters;
      assert.equal(letter.meta.id, "fp-order");
      assert.equal(letter.data.total, 99, "the reused id's payload is kept for a look");
      assert.equal(letter.dead_letter.reason, "poison");
      assert.equal(letter.dead_letter.exception, "payload-mismatch");
      assert.match(letter.dead_letter.error, /different payload/);
      assert.deepEqual((await worker.effects()).effects, { "fp-order": 1 });
    }));

  test("off (the default): the same id with other data is a plain skip", () =>
    withWorker({}, async (worker) => {
      await worker.publishAndWait([envelope("plain-order", { total: 10 })]);
      const stats = await worker.publishAndWait([envelope("plain-order", { total: 99 })]);
      assert.equal(stats.skips, 1, JSON.stringify(stats));
      assert.equal(stats.poison, 0);
      assert.deepEqual((await worker.effects()).effects, { "plain-order": 1 });
    }));
});

// Before 2026-12-07 a fingerprint's record sat in the object of its own hash,
// not its id's: a success remembered then keeps it there for its TTL. Read at
// the id's object only, a same-payload duplicate of such an id found the
// marker without the record and was dead-lettered as a payload mismatch (a
// review). The record is asked for in its old place before that is said.
const OBJECTS = ["bq-dedupe/1/0", "bq-dedupe/jump/1", "bq-dedupe/jump/2", "bq-dedupe/jump/3"];

/** The shard of `key` among `n`, as crates/workers/src/shard.rs places it by its own hash. */
function ownShard(key, n = 4) {
  let k = createHash("sha256").update(key, "utf8").digest().readBigUInt64BE(0);
  let b = -1n;
  let j = 0n;
  while (j < BigInt(n)) {
    b = j;
    k = (k * 2862933555777941757n + 1n) & 0xffffffffffffffffn;
    j = BigInt(Math.trunc(Number(b + 1n) * (2 ** 31 / Number((k >> 33n) + 1n))));
  }
  return Number(b);
}

async function rpc(worker, object, request) {
  const ns = await worker.mf.getDurableObjectNamespace("DEDUPE_DO");
  const res = await ns.get(ns.idFromName(object)).fetch("https://dedupe-shard/rpc", {
    method: "POST",
    body: JSON.stringify(request),
  });
  assert.equal(res.status, 200, await res.clone().text());
  return res.json();
}

describe("payload fingerprints across an upgrade", () => {
  test("a record left in its old object (its own hash's) is found there: the same payload is a skip, not a mismatch", () =>
    withWorker({ vars: { DEDUPE_FINGERPRINT: "on", DEDUPE_SHARDS: "4" } }, async (worker) => {
      const ids = Array.from({ length: 8 }, (_, i) => `fp-old-${i}`);
      await worker.publishAndWait(ids.map((id) => envelope(id, { total: 10 })));
      // An id whose record's own object is not its id's: move the record there.
      let moved;
      for (const [n, object] of OBJECTS.entries()) {
        const { entries } = await rpc(worker, object, { op: "entries", limit: 1000 });
        for (const { key } of entries) {
          const [, hash, id] = key.match(/^\u001ffp:([0-9a-f]{32}):(.*)$/) ?? [];
          if (!moved && hash && ownShard(key) !== n) moved = { key, id, from: object, to: OBJECTS[ownShard(key)] };
        }
      }
      assert.ok(moved, "some record's own object differs from its id's");
      await rpc(worker, moved.from, { op: "forget", keys: [moved.key] });
      await rpc(worker, moved.to, { op: "settle", remember: [{ key: moved.key }], ttl_ms: 3_600_000 });
      const stats = await worker.publishAndWait([envelope(moved.id, { total: 10 })]);
      assert.equal(stats.skips, 1, JSON.stringify(stats));
      assert.equal(stats.poison, 0, JSON.stringify(stats));
      assert.deepEqual((await worker.effects()).effects[moved.id], 1);
    }));
});

describe("payload fingerprints across an upgrade and a reshard", () => {
  // The record of an id that moved between layouts, left in its own hash's
  // object of the previous layout: found there (it was looked for before the
  // previous layout's pass had found the marker, in this layout only: a review).
  test("a record left in its old object of the previous layout is found there: a skip", () =>
    withWorker({ vars: { DEDUPE_FINGERPRINT: "on", DEDUPE_SHARDS: "8", DEDUPE_PREVIOUS_SHARDS: "4" } }, async (worker) => {
      const data = { total: 10 };
      const hash = createHash("sha256").update(JSON.stringify(data)).digest().subarray(0, 16).toString("hex");
      const name = (shard) => (shard === 0 ? "bq-dedupe/1/0" : `bq-dedupe/jump/${shard}`);
      const id = Array.from({ length: 500 }, (_, i) => `fp-moved-${i}`).find((id) => {
        const record = `\u001ffp:${hash}:${id}`;
        const was = ownShard(id, 4);
        return ownShard(id, 8) !== was && ![was, ownShard(id, 8)].includes(ownShard(record, 4))
          && ownShard(record, 8) !== ownShard(record, 4);
      });
      assert.ok(id, "an id that moved, whose record's old object is neither of its id's");
      const record = `\u001ffp:${hash}:${id}`;
      const step = (keys) => ({ op: "settle", remember: keys.map((key) => ({ key })), ttl_ms: 3_600_000 });
      // The id and its marker in its object of the previous layout; its record in its own.
      await rpc(worker, name(ownShard(id, 4)), step([id, `\u001ffp:=${id}`]));
      await rpc(worker, name(ownShard(record, 4)), step([record]));
      const e = envelope(id);
      e.data = data;
      const stats = await worker.publishAndWait([e]);
      assert.equal(stats.skips, 1, JSON.stringify(stats));
      assert.equal(stats.poison, 0, JSON.stringify(stats));
    }));
});
