//! The `bq_dedupe` core as one WASI-free WebAssembly component (WIT world
//! `babelqueue:idempotency/dedupe@1.1.0`): it exports `guard` and `consumer` and
//! imports `store`, `leases` and `handler`.
//!
//! A thin adapter, with no dedupe logic of its own: the `consumer.guard` resource
//! ([`GuardResource`], 1.1.0) holds one `bq_dedupe::Guard` over the host's store
//! ([`store::HostStore`], capabilities read once) built from its options; every
//! free export builds one from the call's `options`. Each runs the core's
//! function and converts the result ([`convert`]).
//! The imports are synchronous, so every core future is ready on its first poll
//! and `block_on_ready` drives it without an executor.
//!
//! With the feature `minimal` the same code targets the world `dedupe-minimal`,
//! whose host provides only `seen-set` (`seen`, `remember`, `forget`) and
//! `handler`: see `seen_set.rs`.
//!
//! Build the components with `scripts/build-component.sh` (it writes
//! `target/component/bq_dedupe.component.wasm` and
//! `target/component/bq_dedupe_minimal.component.wasm`).

// Talc instead of std's dlmalloc: the same job in fewer bytes of wasm.
#[cfg(all(not(target_feature = "atomics"), target_family = "wasm"))]
#[global_allocator]
static TALC: talc::wasm::WasmDynamicTalc = talc::wasm::new_wasm_dynamic_allocator();

mod convert;
// The host's store: the full `store` + `leases` imports, or (feature `minimal`,
// world `dedupe-minimal`) the `seen-set` alone. Everything else is shared.
#[cfg_attr(feature = "minimal", path = "seen_set.rs")]
mod store;

mod bindings {
    #[cfg(not(feature = "minimal"))]
    wit_bindgen::generate!({
        world: "dedupe",
        path: "../../wit",
        // Imported functions take borrowed arguments (`keys: &[&str]`), so the
        // core's key slices go to the host without copying.
        ownership: Borrowing { duplicate_if_necessary: false },
    });
    #[cfg(feature = "minimal")]
    wit_bindgen::generate!({
        world: "dedupe-minimal",
        path: "../../wit",
        ownership: Borrowing { duplicate_if_necessary: false },
    });
}

use bindings::babelqueue::idempotency::{handler, types as wit};
use bindings::exports::babelqueue::idempotency::consumer::GuestGuard;
use bindings::exports::babelqueue::idempotency::{consumer, guard};
use bq_dedupe::{Guard, Message, StoreError, block_on_ready, envelope::Envelope, envelope::Limits};

use crate::store::HostStore;

/// The component: the implementation of both exported interfaces.
struct Component;

bindings::export!(Component with_types_in bindings);

/// Runs `call` on a guard built from `options` over the host's store, driven to
/// completion. Refused options (an invalid `key-scope`) become `refuse(error)`
/// without calling the store; so does a future that did not complete, which
/// cannot happen with synchronous imports but must not trap if it did.
fn with_guard<T>(
    options: wit::Options,
    call: impl AsyncFnOnce(&Guard<HostStore>) -> T,
    refuse: impl FnOnce(StoreError) -> T,
) -> T {
    match per_call(options) {
        Ok(guard) => ready(call(&guard), refuse),
        Err(invalid) => refuse(invalid),
    }
}

/// The guard of one free-function call: its `options` converted (an invalid
/// `key-scope` refused), the store's capabilities read when first needed.
fn per_call(options: wit::Options) -> Result<Guard<HostStore>, StoreError> {
    let options = convert::options(options)?;
    Ok(store::with_host_clock(
        Guard::new(store::per_call()).with_options(options),
    ))
}

/// Drives a core future to completion. The imports are synchronous, so it is
/// ready on its first poll; one that is not becomes `refuse(error)`, not a trap.
fn ready<T>(call: impl Future<Output = T>, refuse: impl FnOnce(StoreError) -> T) -> T {
    block_on_ready(call)
        .unwrap_or_else(|not_ready| refuse(StoreError::internal(not_ready.to_string())))
}

/// Outcomes for `n` deliveries that could not be processed.
fn refused_outcomes(n: usize, e: StoreError) -> Vec<wit::Outcome> {
    vec![wit::Outcome::StoreUnavailable(e.into()); n]
}

/// `process-batch-reports` entries for `n` deliveries that could not be processed.
fn refused_reports(n: usize, e: StoreError) -> Vec<wit::DeliveryReport> {
    let refused = wit::Outcome::StoreUnavailable(e.into());
    (0..n)
        .map(|_| wit::DeliveryReport {
            id: None,
            outcome: refused.clone(),
            duplicate: false,
            claimed: false,
        })
        .collect()
}

/// `process-batch-ids` entries: the reports, less what only a span needs.
fn ids(reports: Vec<wit::DeliveryReport>) -> Vec<wit::Processed> {
    reports
        .into_iter()
        .map(|r| wit::Processed {
            id: r.id,
            outcome: r.outcome,
        })
        .collect()
}

// The calls shared by the resource and the free functions, kept out of line so
// the core's code is in the component once: at opt-level 3, inlining each core
// future into every export that drives it would copy it per export.

/// `process` on `guard`: one delivery, the core's single-delivery path.
#[inline(never)]
fn process_one(guard: &Guard<HostStore>, envelope: &str) -> wit::Outcome {
    ready(
        async { guard.process(envelope, call_handler).await.into() },
        |e| wit::Outcome::StoreUnavailable(e.into()),
    )
}

/// `process-batch-reports` on `guard`: each outcome with its `meta.id` and what
/// its span reports.
#[inline(never)]
fn process_many_reports(
    guard: &Guard<HostStore>,
    envelopes: &[String],
) -> Vec<wit::DeliveryReport> {
    let keyspace = &guard.options().keyspace;
    ready(
        async {
            let processed = guard.process_each(envelopes, call_indexed).await;
            processed
                .into_iter()
                .map(|p| wit::DeliveryReport {
                    duplicate: p.duplicate(),
                    claimed: p.claimed(),
                    id: p.decision.key.and_then(|k| keyspace.into_id(k)),
                    outcome: p.outcome.into(),
                })
                .collect()
        },
        |e| refused_reports(envelopes.len(), e),
    )
}

/// `process-batch-ids` on `guard`: each outcome with its `meta.id` (the
/// reports, less what only a span needs: the batch path stays in the
/// component once).
fn process_many_ids(guard: &Guard<HostStore>, envelopes: &[String]) -> Vec<wit::Processed> {
    ids(process_many_reports(guard, envelopes))
}

/// `process-batch` on `guard`: the same core call as [`process_many_ids`] (the
/// keys it hands back were made anyway), so the batch path is in the component
/// once.
#[inline(never)]
fn process_many(guard: &Guard<HostStore>, envelopes: &[String]) -> Vec<wit::Outcome> {
    ready(
        async {
            let processed = guard.process_each(envelopes, call_indexed).await;
            processed.into_iter().map(|p| p.outcome.into()).collect()
        },
        |e| refused_outcomes(envelopes.len(), e),
    )
}

/// `forget` on `guard`.
#[inline(never)]
fn forget_id(guard: &Guard<HostStore>, id: &str) -> Result<(), wit::StoreError> {
    ready(async { Ok(guard.forget(id).await?) }, |e| Err(e.into()))
}

/// The `consumer.guard` resource (1.1.0): one core guard for its whole life, its
/// options converted and the store's capabilities read once, by the constructor.
pub struct GuardResource {
    guard: Guard<HostStore>,
}

impl GuestGuard for GuardResource {
    fn new(options: wit::GuardOptions) -> Result<Self, wit::StoreError> {
        let options = convert::guard_options(options)?;
        let guard = store::with_host_clock(Guard::new(store::read_once()).with_options(options));
        Ok(GuardResource { guard })
    }

    fn process(&self, envelope: String) -> wit::Outcome {
        process_one(&self.guard, &envelope)
    }

    fn process_batch(&self, envelopes: Vec<String>) -> Vec<wit::Outcome> {
        process_many(&self.guard, &envelopes)
    }

    fn process_batch_ids(&self, envelopes: Vec<String>) -> Vec<wit::Processed> {
        process_many_ids(&self.guard, &envelopes)
    }

    fn process_batch_reports(&self, envelopes: Vec<String>) -> Vec<wit::DeliveryReport> {
        process_many_reports(&self.guard, &envelopes)
    }

    fn forget(&self, id: String) -> Result<(), wit::StoreError> {
        forget_id(&self.guard, &id)
    }
}

/// `handler.handle` as the core's handler: the envelope text exactly as delivered.
async fn call_handler(msg: &Message<'_>) -> Result<(), String> {
    handler::handle(msg.raw())
}

/// [`call_handler`] for a batch, whose handler is also given the index.
async fn call_indexed(_: usize, msg: &Message<'_>) -> Result<(), String> {
    handler::handle(msg.raw())
}

impl guard::Guest for Component {
    // The single-delivery exports go through the batch ones: a batch of one makes
    // the same store calls, and one code path keeps the component ~3 KB smaller.
    fn decide(envelope: String, options: wit::Options) -> wit::Decision {
        let mut decisions = Self::decide_batch(vec![envelope], options);
        decisions
            .pop()
            .unwrap_or_else(|| convert::refused_decision(StoreError::internal("no decision")))
    }

    fn decide_batch(envelopes: Vec<String>, options: wit::Options) -> Vec<wit::Decision> {
        let n = envelopes.len();
        with_guard(
            options,
            async |g| {
                let decisions = g.decide_batch(&envelopes).await;
                decisions.into_iter().map(Into::into).collect()
            },
            |e| vec![convert::refused_decision(e); n],
        )
    }

    fn complete(
        decision: wit::Decision,
        result: Option<wit::HandlerResult>,
        options: wit::Options,
    ) -> wit::Outcome {
        let mut outcomes = Self::complete_batch(vec![decision], vec![result], options);
        outcomes.pop().unwrap_or_else(|| {
            wit::Outcome::StoreUnavailable(StoreError::internal("no outcome").into())
        })
    }

    fn complete_batch(
        decisions: Vec<wit::Decision>,
        results: Vec<Option<wit::HandlerResult>>,
        options: wit::Options,
    ) -> Vec<wit::Outcome> {
        let n = decisions.len();
        let (decisions, rejections): (Vec<_>, Vec<_>) = decisions
            .into_iter()
            .map(|d| {
                let returned = convert::returned(d);
                (returned.decision, returned.rejection)
            })
            .unzip();
        let results = results.into_iter().map(|r| r.map(Into::into)).collect();
        with_guard(
            options,
            async move |g| {
                let outcomes = g.complete_batch(decisions, results).await;
                outcomes
                    .into_iter()
                    .zip(rejections)
                    .map(|(outcome, rejection)| convert::outcome_echoing(outcome, rejection))
                    .collect()
            },
            |e| vec![wit::Outcome::StoreUnavailable(e.into()); n],
        )
    }

    fn forget(id: String, options: wit::Options) -> Result<(), wit::StoreError> {
        match per_call(options) {
            Ok(guard) => forget_id(&guard, &id),
            Err(e) => Err(e.into()),
        }
    }

    fn dedupe_key(
        envelope: String,
        options: wit::Options,
    ) -> Result<Option<String>, wit::Rejection> {
        // The 1.0 result has no store-error channel: an invalid `key-scope` traps
        // here, as the contract says; `dedupe-key-checked` returns it instead.
        match Self::dedupe_key_checked(envelope, options) {
            Ok(key) => Ok(key),
            Err(wit::KeyError::Rejected(rejection)) => Err(rejection),
            Err(wit::KeyError::InvalidOptions(invalid)) => {
                panic!("dedupe-key: {}", invalid.message)
            }
        }
    }

    fn dedupe_key_checked(
        envelope: String,
        options: wit::Options,
    ) -> Result<Option<String>, wit::KeyError> {
        let options =
            convert::options(options).map_err(|e| wit::KeyError::InvalidOptions(e.into()))?;
        let msg = Message::parse_str(&envelope, &options.limits)
            .map_err(|r| wit::KeyError::Rejected(r.into()))?;
        Ok(msg.id().map(|id| options.keyspace.key(id).into_owned()))
    }

    fn decode(envelope: String) -> Result<String, wit::Rejection> {
        let envelope = Envelope::decode(envelope.as_bytes(), &Limits::default())?;
        Ok(envelope.to_json())
    }
}

impl consumer::Guest for Component {
    type Guard = GuardResource;

    // The 1.0 free functions: a guard per call from its `options`, then the
    // resource's code.
    fn process(envelope: String, options: wit::Options) -> wit::Outcome {
        match per_call(options) {
            Ok(guard) => process_one(&guard, &envelope),
            Err(e) => wit::Outcome::StoreUnavailable(e.into()),
        }
    }

    fn process_batch(envelopes: Vec<String>, options: wit::Options) -> Vec<wit::Outcome> {
        match per_call(options) {
            Ok(guard) => process_many(&guard, &envelopes),
            Err(e) => refused_outcomes(envelopes.len(), e),
        }
    }

    fn process_batch_ids(envelopes: Vec<String>, options: wit::Options) -> Vec<wit::Processed> {
        match per_call(options) {
            Ok(guard) => process_many_ids(&guard, &envelopes),
            Err(e) => ids(refused_reports(envelopes.len(), e)),
        }
    }

    fn forget(id: String, options: wit::Options) -> Result<(), wit::StoreError> {
        <Component as guard::Guest>::forget(id, options)
    }
}
