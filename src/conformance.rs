//! Runs a BabelQueue conformance manifest (`manifest.json`: the envelope `cases`,
//! `idempotency.dedup_key` and `idempotency.sequences`) against any implementation
//! behind [`Subject`]: the native core here, the WebAssembly component in the
//! host, the wasm-bindgen build in the playground. One runner, so every target is
//! judged by the same reading of the manifest.

use serde::Deserialize;
use serde_json::Value;

use crate::{
    Guard, InMemoryStore, KeySpace, Message, OutcomeKind, Store, block_on_ready,
    envelope::Envelope, envelope::Limits,
};

/// What the implementation under test must do.
pub trait Subject {
    /// Decodes and validates an envelope, returning it as JSON (canonical `job`),
    /// or the rejection reason.
    fn decode(&mut self, raw: &[u8]) -> Result<Value, String>;
    /// The dedupe key of an envelope (`None`: no usable id, fail-open).
    fn dedup_key(&mut self, raw: &[u8]) -> Result<Option<String>, String>;
    /// Starts from an empty seen-set (each sequence runs on its own).
    fn reset(&mut self) -> Result<(), String>;
    /// Forgets a `meta.id`.
    fn forget(&mut self, id: &str) -> Result<(), String>;
    /// Delivers one envelope through the guarded handler, which succeeds when
    /// `succeed` is true and fails otherwise; says whether the handler ran.
    fn deliver(&mut self, raw: &[u8], succeed: bool) -> Result<Effect, String>;
}

/// What a delivery did, as the manifest names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// The handler was invoked.
    Run,
    /// The handler was not invoked and the delivery is acked.
    Skip,
    /// Anything else (park, reject, store error), by its outcome code.
    Other(String),
}

impl Effect {
    /// What a delivery with this outcome did, as the manifest names it.
    pub fn of(kind: OutcomeKind) -> Effect {
        if kind.handler_ran() {
            Effect::Run
        } else if kind == OutcomeKind::Skipped {
            Effect::Skip
        } else {
            Effect::Other(kind.code().to_string())
        }
    }

    fn name(&self) -> &str {
        match self {
            Effect::Run => "run",
            Effect::Skip => "skip",
            Effect::Other(code) => code,
        }
    }
}

/// One checked item of the manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaseResult {
    /// The case's name in the manifest.
    pub name: String,
    /// Why it failed; `None` when it passed.
    pub failure: Option<String>,
}

impl std::fmt::Display for CaseResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.failure {
            None => write!(f, "ok {}", self.name),
            Some(why) => write!(f, "FAIL {}: {why}", self.name),
        }
    }
}

/// Every result of a run, in manifest order.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// One result per checked item.
    pub results: Vec<CaseResult>,
}

impl Report {
    /// How many items passed.
    pub fn passed(&self) -> usize {
        self.results.iter().filter(|r| r.failure.is_none()).count()
    }
    /// How many items failed.
    pub fn failed(&self) -> usize {
        self.results.len() - self.passed()
    }
    /// `N passed, N failed`.
    pub fn summary(&self) -> String {
        format!("{} passed, {} failed", self.passed(), self.failed())
    }
}

#[derive(Deserialize)]
struct Manifest {
    cases: Vec<Case>,
    idempotency: Idempotency,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    file: String,
    valid: bool,
    #[serde(default)]
    expect: Option<Value>,
}

#[derive(Deserialize)]
struct Idempotency {
    dedup_key: DedupKey,
    sequences: Sequences,
}

#[derive(Deserialize)]
struct DedupKey {
    envelope_file: String,
    expected_key: String,
}

#[derive(Deserialize)]
struct Sequences {
    cases: Vec<Sequence>,
}

#[derive(Deserialize)]
struct Sequence {
    name: String,
    deliveries: Vec<Delivery>,
    expected_effects: usize,
}

#[derive(Deserialize)]
struct Delivery {
    meta_id: String,
    expect_effect: String,
    #[serde(default)]
    outcome: Option<String>,
    #[serde(default)]
    forget_before: bool,
}

/// Runs the whole manifest. `load` reads a fixture by its manifest-relative path;
/// `on_result` sees each result as it is decided (to print a line per case).
pub fn run(
    manifest: &str,
    mut load: impl FnMut(&str) -> Result<Vec<u8>, String>,
    subject: &mut impl Subject,
    mut on_result: impl FnMut(&CaseResult),
) -> Result<Report, String> {
    let manifest: Manifest =
        serde_json::from_str(manifest).map_err(|e| format!("unreadable manifest: {e}"))?;
    let mut report = Report::default();
    let mut record = |name: String, outcome: Result<(), String>| {
        let result = CaseResult {
            name,
            failure: outcome.err(),
        };
        on_result(&result);
        report.results.push(result);
    };

    for case in &manifest.cases {
        let outcome = load(&case.file).and_then(|raw| check_case(case, &raw, subject));
        record(case.name.clone(), outcome);
    }

    let key = &manifest.idempotency.dedup_key;
    let template = load(&key.envelope_file);
    let outcome = template
        .clone()
        .and_then(|raw| match subject.dedup_key(&raw)? {
            Some(k) if k == key.expected_key => Ok(()),
            other => Err(format!("key {other:?}, expected {:?}", key.expected_key)),
        });
    record("dedup-key".into(), outcome);

    for seq in &manifest.idempotency.sequences.cases {
        let outcome = template
            .clone()
            .and_then(|raw| check_sequence(seq, &raw, subject));
        record(seq.name.clone(), outcome);
    }
    Ok(report)
}

fn check_case(case: &Case, raw: &[u8], subject: &mut impl Subject) -> Result<(), String> {
    match (subject.decode(raw), case.valid) {
        (Ok(env), true) => match &case.expect {
            Some(expect) => check_expectations(&env, expect),
            None => Ok(()),
        },
        (Err(reason), true) => Err(format!("rejected a valid envelope: {reason}")),
        (Ok(_), false) => Err("accepted an invalid envelope".into()),
        (Err(_), false) => Ok(()),
    }
}

/// Compares the manifest's `expect` block with the decoded envelope.
fn check_expectations(env: &Value, expect: &Value) -> Result<(), String> {
    let Some(expect) = expect.as_object() else {
        return Ok(());
    };
    for (field, want) in expect {
        let got = match field.as_str() {
            "urn" => env.get("job"),
            "lang" | "schema_version" => env.pointer(&format!("/meta/{field}")),
            "dead_letter" => {
                // Expected fields are a subset of the block.
                let block = env.get("dead_letter");
                for (k, v) in want.as_object().into_iter().flatten() {
                    let got = block.and_then(|b| b.get(k));
                    if got != Some(v) {
                        return Err(format!("dead_letter.{k} is {got:?}, expected {v}"));
                    }
                }
                continue;
            }
            other => env.get(other),
        };
        if got != Some(want) {
            return Err(format!("{field} is {got:?}, expected {want}"));
        }
    }
    Ok(())
}

fn check_sequence(
    seq: &Sequence,
    template: &[u8],
    subject: &mut impl Subject,
) -> Result<(), String> {
    subject.reset()?;
    let mut envelope: Value =
        serde_json::from_slice(template).map_err(|e| format!("unreadable template: {e}"))?;
    let mut effects = 0;
    for (n, delivery) in seq.deliveries.iter().enumerate() {
        if delivery.forget_before {
            subject.forget(&delivery.meta_id)?;
        }
        envelope["meta"]["id"] = Value::String(delivery.meta_id.clone());
        let raw = envelope.to_string();
        let succeed = delivery.outcome.as_deref() != Some("throw");
        let effect = subject.deliver(raw.as_bytes(), succeed)?;
        if effect.name() != delivery.expect_effect {
            return Err(format!(
                "delivery {} ({:?}): {}, expected {}",
                n + 1,
                delivery.meta_id,
                effect.name(),
                delivery.expect_effect
            ));
        }
        // The sequences count every handler invocation as an effect, thrown or not
        // (`throw-leaves-id-unmarked`: run-throw, run-throw, run-ok, skip = 3).
        if effect == Effect::Run {
            effects += 1;
        }
    }
    if effects != seq.expected_effects {
        return Err(format!(
            "{effects} effects, expected {}",
            seq.expected_effects
        ));
    }
    Ok(())
}

/// A [`Guard`] over any [`Store`] as a [`Subject`]. `reset` moves the guard to a
/// fresh key prefix instead of wiping the store, so a persistent store starts each
/// sequence empty and reruns never meet earlier runs' ids.
#[derive(Debug)]
pub struct GuardSubject<S> {
    guard: Option<Guard<S>>,
    base: String,
    sequence: u32,
    claim_lease: Option<std::time::Duration>,
}

/// The native core with the in-memory store.
pub type CoreSubject = GuardSubject<InMemoryStore>;

impl Default for CoreSubject {
    fn default() -> Self {
        GuardSubject::new(InMemoryStore::new())
    }
}

impl<S: Store> GuardSubject<S> {
    /// A subject that runs each case through a guard over `store`.
    pub fn new(store: S) -> Self {
        GuardSubject {
            guard: Some(Guard::new(store)),
            base: String::new(),
            sequence: 0,
            claim_lease: None,
        }
    }

    /// Key prefixes start with `base` (make it unique per run on a shared store).
    pub fn with_prefix_base(mut self, base: impl Into<String>) -> Self {
        self.base = base.into();
        self
    }

    /// Runs the sequences in claiming mode.
    pub fn with_claiming(mut self, lease: std::time::Duration) -> Self {
        self.claim_lease = Some(lease);
        self
    }

    fn guard(&self) -> Result<&Guard<S>, String> {
        self.guard.as_ref().ok_or_else(|| "no guard".to_string())
    }
}

impl<S: Store> Subject for GuardSubject<S> {
    fn decode(&mut self, raw: &[u8]) -> Result<Value, String> {
        let env = Envelope::decode(raw, &Limits::default()).map_err(|r| r.to_string())?;
        serde_json::to_value(env).map_err(|e| e.to_string())
    }

    fn dedup_key(&mut self, raw: &[u8]) -> Result<Option<String>, String> {
        // The dedupe key is meta.id; the per-sequence prefix only isolates runs.
        let msg = Message::parse(raw, &Limits::default()).map_err(|r| r.to_string())?;
        Ok(msg.id().map(str::to_owned))
    }

    fn reset(&mut self) -> Result<(), String> {
        self.sequence += 1;
        let keyspace = KeySpace::new().with_prefix(format!("{}{}:", self.base, self.sequence));
        let mut guard = self.guard.take().ok_or("no guard")?.with_keyspace(keyspace);
        if let Some(lease) = self.claim_lease {
            guard = guard.with_claiming(lease);
        }
        self.guard = Some(guard);
        Ok(())
    }

    fn forget(&mut self, id: &str) -> Result<(), String> {
        block_on_ready(self.guard()?.forget(id))
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())
    }

    fn deliver(&mut self, raw: &[u8], succeed: bool) -> Result<Effect, String> {
        let outcome = block_on_ready(self.guard()?.process(raw, async |_| {
            if succeed {
                Ok(())
            } else {
                Err("handler threw")
            }
        }))
        .map_err(|e| e.to_string())?;
        Ok(Effect::of(outcome.kind()))
    }
}
