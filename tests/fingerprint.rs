//! Payload fingerprints (`Options::fingerprint`): an id reused with another `data`
//! is a `payload-mismatch` (dead-lettered, not run); a redelivery, however its
//! payload is encoded, is still a skip.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bq_dedupe::store::PerKey;
use bq_dedupe::{
    Disposition, Guard, HandlerResult, InMemoryStore, Message, Outcome, Store, StoreResult,
    block_on_ready, clock::ManualClock, store::StoreErrorKind,
};
use common::FlakyStore;

fn envelope(id: &str, data: &str) -> String {
    format!(
        r#"{{"job":"urn:babel:orders:created","trace_id":"t-1","data":{data},"meta":{{"id":"{id}","schema_version":1}},"attempts":0}}"#
    )
}

/// Runs `bodies` as one batch; returns the outcome codes and the ids that ran.
fn batch<S: Store>(guard: &Guard<S>, bodies: &[String]) -> (Vec<&'static str>, Vec<String>) {
    let mut ran = Vec::new();
    let outcomes = block_on_ready(guard.process_batch(bodies, async |m: &Message<'_>| {
        ran.push(m.id().unwrap_or_default().to_string());
        Ok::<(), String>(())
    }))
    .expect("a synchronous store");
    (outcomes.iter().map(|o| o.kind().code()).collect(), ran)
}

/// One delivery: its outcome, and whether the handler ran.
fn deliver<S: Store>(guard: &Guard<S>, body: &str) -> (Outcome<String>, bool) {
    let mut ran = false;
    let outcome = block_on_ready(guard.process(body.as_bytes(), async |_: &Message<'_>| {
        ran = true;
        Ok::<(), String>(())
    }))
    .expect("a synchronous store");
    (outcome, ran)
}

fn one<S: Store>(guard: &Guard<S>, body: &str) -> (&'static str, bool) {
    let (outcome, ran) = deliver(guard, body);
    (outcome.kind().code(), ran)
}

#[test]
fn a_reused_id_with_another_payload_is_a_mismatch_and_does_not_run() {
    let guard = Guard::new(InMemoryStore::new()).with_fingerprint();
    assert_eq!(
        one(&guard, &envelope("o-1", r#"{"total":10}"#)),
        ("run-ok", true)
    );
    // The same payload, spelled differently: a redelivery.
    assert_eq!(
        one(&guard, &envelope("o-1", r#"{ "total" : 10 }"#)),
        ("skip", false)
    );
    let (outcome, ran) = deliver(&guard, &envelope("o-1", r#"{"total":99}"#));
    assert!(!ran, "a mismatch never runs");
    assert_eq!(outcome, Outcome::PayloadMismatch);
    assert_eq!(outcome.disposition(), Disposition::Poison);
    assert!(outcome.reason().unwrap().contains("different payload"));
    // It stays a mismatch: nothing was overwritten by it.
    assert_eq!(
        one(&guard, &envelope("o-1", r#"{"total":99}"#)),
        ("payload-mismatch", false)
    );
    assert_eq!(
        one(&guard, &envelope("o-1", r#"{"total":10}"#)),
        ("skip", false)
    );
}

#[test]
fn claiming_mode_checks_fingerprints_too() {
    let guard = Guard::new(InMemoryStore::new())
        .with_claiming(Duration::from_secs(30))
        .with_fingerprint();
    assert_eq!(
        one(&guard, &envelope("c-1", r#"{"a":[1,2]}"#)),
        ("run-ok", true)
    );
    assert_eq!(
        one(&guard, &envelope("c-1", r#"{"a":[1,2]}"#)),
        ("skip", false)
    );
    assert_eq!(
        one(&guard, &envelope("c-1", r#"{"a":[2,1]}"#)),
        ("payload-mismatch", false)
    );
    assert!(
        guard.store().claimed().is_empty(),
        "a mismatch takes no claim"
    );
}

#[test]
fn ids_remembered_without_fingerprints_are_skipped_not_mismatched() {
    let store = InMemoryStore::new();
    let before = Guard::new(&store);
    assert_eq!(
        one(&before, &envelope("old", r#"{"v":1}"#)),
        ("run-ok", true)
    );
    // Turned on later (or another consumer remembered it): no marker, so a skip.
    let after = Guard::new(&store).with_fingerprint();
    assert_eq!(one(&after, &envelope("old", r#"{"v":2}"#)), ("skip", false));
    // And a consumer without the option reads fingerprinted ids as plain ones.
    assert_eq!(
        one(&after, &envelope("new", r#"{"v":1}"#)),
        ("run-ok", true)
    );
    assert_eq!(
        one(&before, &envelope("new", r#"{"v":2}"#)),
        ("skip", false)
    );
}

#[test]
fn in_one_batch_the_first_payload_runs_and_another_is_a_mismatch() {
    let guard = Guard::new(InMemoryStore::new()).with_fingerprint();
    let bodies = [
        envelope("b-1", r#"{"n":1}"#),
        envelope("b-1", r#"{"n":1}"#),
        envelope("b-1", r#"{"n":2}"#),
        envelope("b-2", r#"{"n":1}"#),
    ];
    let (codes, ran) = batch(&guard, &bodies);
    assert_eq!(codes, ["run-ok", "skip", "payload-mismatch", "run-ok"]);
    assert_eq!(ran, ["b-1", "b-2"]);
    let (codes, ran) = batch(&guard, &bodies);
    assert_eq!(codes, ["skip", "skip", "payload-mismatch", "skip"]);
    assert!(ran.is_empty());
}

/// An id processed with one payload, redelivered in a batch behind another
/// payload: the redelivery is a skip, not a mismatch. It followed its leader's
/// verdict (the leader's payload differed), so it was dead-lettered as poison
/// though it matched what was processed (a trial's finding, on Workers); sent
/// alone it was a skip. In both modes.
#[test]
fn a_redelivery_behind_another_payload_in_its_batch_is_a_skip() {
    for claiming in [false, true] {
        let mut guard = Guard::new(InMemoryStore::new()).with_fingerprint();
        if claiming {
            guard = guard.with_claiming(Duration::from_secs(30));
        }
        let first = [envelope("r-1", r#"{"a":1}"#)];
        assert_eq!(batch(&guard, &first).0, ["run-ok"]);
        let bodies = [
            envelope("r-1", r#"{"a":2}"#),
            envelope("r-1", r#"{"a":1}"#),
            envelope("r-1", r#"{"a":3}"#),
        ];
        let (codes, ran) = batch(&guard, &bodies);
        assert_eq!(
            codes,
            ["payload-mismatch", "skip", "payload-mismatch"],
            "claiming: {claiming}"
        );
        assert!(ran.is_empty());
    }
}

/// A copy of a delivery found to mismatch the recorded payload is a mismatch
/// too, as it is alone: it came back `park` (retried, and never dead-lettered;
/// exit 3 from the CLI where one at a time gave 4: a review).
#[test]
fn a_copy_of_a_mismatched_delivery_in_its_batch_is_a_mismatch_too() {
    let guard = Guard::new(InMemoryStore::new()).with_fingerprint();
    assert_eq!(
        batch(&guard, &[envelope("m-1", r#"{"v":1}"#)]).0,
        ["run-ok"]
    );
    let bodies = [envelope("m-1", r#"{"v":2}"#), envelope("m-1", r#"{"v":2}"#)];
    let (codes, ran) = batch(&guard, &bodies);
    assert_eq!(codes, ["payload-mismatch", "payload-mismatch"]);
    assert!(ran.is_empty());
}

/// Another payload behind an earlier delivery of its id that did not run (its
/// claim held by another consumer) or failed: nothing was processed yet, so it
/// waits (`park`) rather than being dead-lettered as "already processed with a
/// different payload", which was false (a review, through the CLI); it is
/// judged against what gets recorded when it comes again.
#[test]
fn another_payload_behind_a_delivery_that_did_not_run_waits_for_it() {
    let store = InMemoryStore::new();
    let guard = Guard::new(&store)
        .with_claiming(Duration::from_secs(30))
        .with_fingerprint();
    let other = Guard::new(&store)
        .with_claiming(Duration::from_secs(30))
        .with_fingerprint();
    let (a, b) = (
        envelope("w-1", r#"{"p":"a"}"#),
        envelope("w-1", r#"{"p":"b"}"#),
    );
    // Another consumer is running payload b.
    let plan = block_on_ready(other.decide_batch(std::slice::from_ref(&b))).unwrap();
    assert!(plan[0].should_run());
    let (codes, ran) = batch(&guard, &[a.clone(), b.clone()]);
    assert_eq!(codes, ["park", "park"]);
    assert!(ran.is_empty());
    // It finishes: b was processed, a is the mismatch.
    let done = block_on_ready(other.complete_batch(plan, vec![Some(HandlerResult::<String>::Ok)]));
    assert_eq!(done.unwrap()[0].kind().code(), "run-ok");
    assert_eq!(one(&guard, &b), ("skip", false));
    assert_eq!(one(&guard, &a), ("payload-mismatch", false));

    // Behind a first payload whose handler failed: the second waits too.
    let failing = Guard::new(InMemoryStore::new()).with_fingerprint();
    let bodies = [
        envelope("w-2", r#"{"p":"a"}"#),
        envelope("w-2", r#"{"p":"b"}"#),
    ];
    let outcomes = block_on_ready(failing.process_batch(&bodies, async |_: &Message<'_>| {
        Err::<(), String>("declined".into())
    }))
    .unwrap();
    let codes: Vec<&str> = outcomes.iter().map(|o| o.kind().code()).collect();
    assert_eq!(codes, ["run-failed", "park"]);
}

#[test]
fn a_fresh_batch_costs_two_store_calls_and_skips_one_more() {
    let guard = Guard::new(FlakyStore::new()).with_fingerprint();
    let fresh: Vec<String> = (0..100)
        .map(|i| envelope(&format!("f-{i}"), &format!(r#"{{"i":{i}}}"#)))
        .collect();
    let (codes, _) = batch(&guard, &fresh);
    assert!(codes.iter().all(|c| *c == "run-ok"), "{codes:?}");
    assert_eq!(guard.store().calls(), ["seen_many", "settle"]);
    // Each success is one id and its two companion records.
    assert_eq!(guard.store().inner.len(), 300);

    guard.store().calls.borrow_mut().clear();
    let (codes, _) = batch(&guard, &fresh);
    assert!(codes.iter().all(|c| *c == "skip"), "{codes:?}");
    assert_eq!(guard.store().calls(), ["seen_many", "seen_many"]);
}

/// Answers for ids; fails every read of a fingerprint record.
struct CompanionsDown(InMemoryStore);

impl Store for CompanionsDown {
    async fn forget(&self, key: &str) -> StoreResult<()> {
        self.0.forget(key).await
    }
    async fn seen_many(&self, keys: &[&str]) -> StoreResult<Vec<bool>> {
        if keys.iter().any(|k| k.starts_with('\u{1f}')) {
            return Err(bq_dedupe::StoreError::unavailable(
                "fingerprints: backend down",
            ));
        }
        self.0.seen_many(keys).await
    }
    async fn remember_many(&self, keys: &[&str], ttl: Option<Duration>) -> StoreResult<()> {
        self.0.remember_many(keys, ttl).await
    }
}

#[test]
fn a_failed_fingerprint_read_fails_closed() {
    let guard = Guard::new(CompanionsDown(InMemoryStore::new())).with_fingerprint();
    assert_eq!(one(&guard, &envelope("x", r#"{"v":1}"#)), ("run-ok", true));
    // The id is known processed, but whether with this payload is unknown: retry.
    let bodies = [envelope("x", r#"{"v":2}"#), envelope("y", r#"{"v":1}"#)];
    let (codes, ran) = batch(&guard, &bodies);
    assert_eq!(codes, ["store-unavailable", "run-ok"]);
    assert_eq!(ran, ["y"]);
}

/// A store whose first write applies its first two keys and then fails, as a
/// Redis pipeline that broke part-way (each command applied on its own).
struct BrokenPartWay(InMemoryStore, std::sync::atomic::AtomicBool);

impl Store for BrokenPartWay {
    async fn forget(&self, key: &str) -> StoreResult<()> {
        self.0.forget(key).await
    }
    async fn seen_many(&self, keys: &[&str]) -> StoreResult<Vec<bool>> {
        self.0.seen_many(keys).await
    }
    async fn remember_many(&self, keys: &[&str], ttl: Option<Duration>) -> StoreResult<()> {
        if self.1.swap(false, std::sync::atomic::Ordering::SeqCst) {
            self.0
                .remember_many(&keys[..2.min(keys.len())], ttl)
                .await?;
            return Err(bq_dedupe::StoreError::unavailable("broke part-way"));
        }
        self.0.remember_many(keys, ttl).await
    }
}

/// A success whose write broke part-way leaves no id recorded before its
/// fingerprint: the companions are written first, the id last. Written after
/// the id, a break left the id and its marker without its record, and the
/// redelivery of the same payload was a payload mismatch, dead-lettered (a
/// review).
#[test]
fn a_write_broken_part_way_never_leaves_an_id_without_its_fingerprint() {
    let store = BrokenPartWay(InMemoryStore::new(), true.into());
    let guard = Guard::new(store).with_fingerprint();
    let body = envelope("w", r#"{"v":1}"#);
    assert_eq!(one(&guard, &body), ("run-ok-unrecorded", true));
    // The redelivery runs again (the first was said unrecorded), or skips:
    // never a mismatch.
    assert_eq!(one(&guard, &body), ("run-ok", true));
    assert_eq!(one(&guard, &body), ("skip", false));
    assert_eq!(
        one(&guard, &envelope("w", r#"{"v":2}"#)).0,
        "payload-mismatch"
    );
}

#[test]
fn forgetting_an_id_forgets_its_fingerprint_marker() {
    let guard = Guard::new(InMemoryStore::new()).with_fingerprint();
    assert_eq!(one(&guard, &envelope("g", r#"{"v":1}"#)).0, "run-ok");
    block_on_ready(guard.forget("g")).unwrap().unwrap();
    // It runs again with a new payload, which is then the remembered one.
    assert_eq!(one(&guard, &envelope("g", r#"{"v":2}"#)), ("run-ok", true));
    assert_eq!(one(&guard, &envelope("g", r#"{"v":2}"#)), ("skip", false));
    assert_eq!(
        one(&guard, &envelope("g", r#"{"v":3}"#)),
        ("payload-mismatch", false)
    );
}

#[test]
fn companion_records_expire_with_the_id() {
    let clock = Arc::new(ManualClock::new(1_000));
    let store = InMemoryStore::with_clock(clock.clone());
    let guard = Guard::new(&store)
        .with_ttl(Duration::from_secs(60))
        .with_fingerprint();
    assert_eq!(one(&guard, &envelope("t", r#"{"v":1}"#)).0, "run-ok");
    clock.advance(61_000);
    assert_eq!(
        store.purge_expired(),
        3,
        "the id and both companion records"
    );
    assert_eq!(one(&guard, &envelope("t", r#"{"v":2}"#)), ("run-ok", true));
}

/// A store that keeps another SDK's records: fingerprints are refused there.
struct GoFormat(InMemoryStore);

impl bq_dedupe::store::KeyStore for GoFormat {
    async fn seen(&self, key: &str) -> StoreResult<bool> {
        self.0.seen(key).await
    }
    async fn remember(&self, key: &str, ttl: Option<Duration>) -> StoreResult<()> {
        self.0.remember(key, ttl).await
    }
    async fn forget(&self, key: &str) -> StoreResult<()> {
        self.0.forget(key).await
    }
    fn shared_format(&self) -> Option<&'static str> {
        Some("the Go SDK's")
    }
}

#[test]
fn a_store_of_another_sdks_format_refuses_fingerprints_without_running() {
    let guard = Guard::new(PerKey(GoFormat(InMemoryStore::new()))).with_fingerprint();
    let (outcome, ran) = deliver(&guard, &envelope("z", "{}"));
    match outcome {
        Outcome::StoreUnavailable(e) => {
            assert_eq!(e.kind, StoreErrorKind::Unsupported);
            assert!(e.message.contains("Go SDK"), "{}", e.message);
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(!ran);
    assert!(guard.store().0.0.is_empty(), "nothing written");
    // Without the option the store works as always.
    let plain = Guard::new(PerKey(GoFormat(InMemoryStore::new())));
    assert_eq!(one(&plain, &envelope("z", "{}")), ("run-ok", true));
}

/// An id shaped like another id's fingerprint record (U+001F `fp:` + its key,
/// only a hostile producer sends one) was read as that record: a distinct
/// message skipped unrun, by a consumer with fingerprints or without on the
/// same store; and sent first, it made the real id's first delivery a
/// payload mismatch (an adversarial review's finding). Such a key gets one
/// more U+001F in our own formats.
#[test]
fn an_id_shaped_like_a_fingerprint_record_is_its_own_key() {
    let store = Arc::new(InMemoryStore::new());
    let with = Guard::new(store.clone()).with_fingerprint();
    let without = Guard::new(store.clone());
    assert_eq!(one(&with, &envelope("x-1", r#"{"n":1}"#)), ("run-ok", true));
    // JSON's \u001f escape: the id starts with U+001F "fp:".
    let forged = envelope(r"\u001ffp:x-1", r#"{"n":1}"#);
    assert_eq!(
        one(&without, &forged),
        ("run-ok", true),
        "a distinct message runs"
    );
    assert_eq!(
        one(&with, &forged),
        ("skip", false),
        "and is then remembered"
    );
    let hash = bq_dedupe::fingerprint::Fingerprint::of(&envelope("x-1", r#"{"n":1}"#), "x-1")
        .unwrap()
        .hash;
    let record = envelope(&format!(r"\u001ffp:{hash}:x-1"), r#"{"n":1}"#);
    assert_eq!(one(&with, &record), ("run-ok", true));
    // Sent before the real id, a forged marker does not make it a mismatch.
    assert_eq!(
        one(&without, &envelope(r"\u001ffp:x-2", "{}")),
        ("run-ok", true)
    );
    assert_eq!(one(&with, &envelope("x-2", r#"{"n":2}"#)), ("run-ok", true));
    assert_eq!(one(&with, &envelope("x-2", r#"{"n":2}"#)), ("skip", false));
    // A plain ASCII id `HASH:K` wrote a marker that was K's record for HASH,
    // so K's changed payload read as a redelivery (the final review's finding).
    assert_eq!(one(&with, &envelope("k-1", r#"{"n":1}"#)), ("run-ok", true));
    let other = bq_dedupe::fingerprint::Fingerprint::of(&envelope("k-1", r#"{"n":2}"#), "k-1")
        .unwrap()
        .hash;
    assert_eq!(
        one(&with, &envelope(&format!("{other}:k-1"), "{}")),
        ("run-ok", true)
    );
    assert_eq!(
        one(&with, &envelope("k-1", r#"{"n":2}"#)),
        ("payload-mismatch", false)
    );
}

/// The escape is KeySpace's own: every key that would start with U+001F gets
/// one more, and `id_of` gives back the id (reports show `meta.id`, not the key).
#[test]
fn keys_that_would_start_with_u001f_are_escaped_and_read_back() {
    use bq_dedupe::KeySpace;
    let plain = KeySpace::new();
    assert_eq!(plain.key("\u{1f}x"), "\u{1f}\u{1f}x");
    assert_eq!(plain.id_of("\u{1f}\u{1f}x"), Some("\u{1f}x"));
    assert_eq!(plain.key("x\u{1f}"), "x\u{1f}");
    let odd = KeySpace::new().with_prefix("\u{1f}");
    assert_eq!(odd.key("plain"), "\u{1f}\u{1f}plain");
    assert_eq!(odd.id_of("\u{1f}\u{1f}plain"), Some("plain"));
    assert_eq!(
        odd.into_id("\u{1f}\u{1f}plain".to_string()).as_deref(),
        Some("plain")
    );
    let scoped = KeySpace::new().with_scope("s").unwrap();
    assert_eq!(
        scoped.key("\u{1f}x"),
        "s:\u{1f}x",
        "only the key's first character counts"
    );
}

/// A batch of one id under many payloads is decided and resolved in linear
/// time: each mismatch looked through the batch for its leader (twice: the
/// fingerprint check and the resolve), so 80,000 took 12 s in a trial of the
/// component (18.6 s here in release, 0.21 s after). 40,000 in a debug build:
/// 7.3 s before, 0.57 s after.
#[test]
fn one_id_under_many_payloads_in_a_batch_resolves_in_linear_time() {
    let guard = Guard::new(InMemoryStore::new()).with_fingerprint();
    let bodies: Vec<String> = (0..40_000)
        .map(|n| envelope("many", &format!(r#"{{"n":{n}}}"#)))
        .collect();
    let started = std::time::Instant::now();
    let (codes, ran) = batch(&guard, &bodies);
    let took = started.elapsed();
    assert_eq!(ran, ["many"]);
    assert_eq!(codes[0], "run-ok");
    assert!(codes[1..].iter().all(|c| *c == "payload-mismatch"));
    // (6 s: room for a loaded machine, under the quadratic 7.3 s.)
    assert!(took < Duration::from_secs(6), "{took:?}");
}
