//! The `bq_dedupe` core as one WASI-free WebAssembly component (WIT world
//! `babelqueue:idempotency/dedupe@1.1.0`): it exports `guard` and `consumer` and
//! imports `store`, `leases` and `handler`.
//!
//! A thin adapter, with no dedupe logic of its own: every export builds a
//! `bq_dedupe::Guard` over the host's store ([`store::HostStore`]) from the call's
//! `options`, runs the core's function, and converts the result ([`convert`]).
//! The imports are synchronous, so every core future is ready on its first poll
//! and `block_on_ready` drives it without an executor.
//!
//! Build the component with `scripts/build-component.sh` (it writes
//! `target/component/bq_dedupe.component.wasm`).

// Talc instead of std's dlmalloc: the same job in fewer bytes of wasm.
#[cfg(all(not(target_feature = "atomics"), target_family = "wasm"))]
#[global_allocator]
static TALC: talc::wasm::WasmDynamicTalc = talc::wasm::new_wasm_dynamic_allocator();

mod convert;
mod store;

mod bindings {
    wit_bindgen::generate!({
        world: "dedupe",
        path: "../../wit",
        // Imported functions take borrowed arguments (`keys: &[&str]`), so the
        // core's key slices go to the host without copying.
        ownership: Borrowing { duplicate_if_necessary: false },
    });
}

use bindings::babelqueue::idempotency::{handler, types as wit};
use bindings::exports::babelqueue::idempotency::{consumer, guard};
use bq_dedupe::{Envelope, Guard, Limits, Message, StoreError, block_on_ready};

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
    let options = match convert::options(options) {
        Ok(options) => options,
        Err(invalid) => return refuse(invalid),
    };
    let guard = Guard::new(HostStore::new())
        .with_options(options)
        .with_clock(std::sync::Arc::new(store::HostClock));
    block_on_ready(call(&guard))
        .unwrap_or_else(|not_ready| refuse(StoreError::internal(not_ready.to_string())))
}

/// `handler.handle` as the core's handler: the envelope text exactly as delivered.
async fn call_handler(msg: &Message<'_>) -> Result<(), String> {
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
        with_guard(
            options,
            async |g| Ok(g.forget(&id).await?),
            |e| Err(e.into()),
        )
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
        let msg = Message::parse(envelope.as_bytes(), &options.limits)
            .map_err(|r| wit::KeyError::Rejected(r.into()))?;
        Ok(msg.id().map(|id| options.keyspace.key(id).into_owned()))
    }

    fn decode(envelope: String) -> Result<String, wit::Rejection> {
        let envelope = Envelope::decode(envelope.as_bytes(), &Limits::default())?;
        Ok(envelope.to_json())
    }
}

impl consumer::Guest for Component {
    fn process(envelope: String, options: wit::Options) -> wit::Outcome {
        let mut outcomes = Self::process_batch(vec![envelope], options);
        outcomes.pop().unwrap_or_else(|| {
            wit::Outcome::StoreUnavailable(StoreError::internal("no outcome").into())
        })
    }

    fn process_batch(envelopes: Vec<String>, options: wit::Options) -> Vec<wit::Outcome> {
        let n = envelopes.len();
        with_guard(
            options,
            async |g| {
                let outcomes = g.process_batch(&envelopes, call_handler).await;
                outcomes.into_iter().map(Into::into).collect()
            },
            |e| vec![wit::Outcome::StoreUnavailable(e.into()); n],
        )
    }

    fn process_batch_ids(envelopes: Vec<String>, options: wit::Options) -> Vec<wit::Processed> {
        let n = envelopes.len();
        with_guard(
            options,
            async |g| {
                let keyspace = &g.options().keyspace;
                let keyed = g.process_batch_keyed(&envelopes, call_handler).await;
                keyed
                    .into_iter()
                    .map(|(key, outcome)| wit::Processed {
                        id: key
                            .as_deref()
                            .and_then(|k| keyspace.id_of(k))
                            .map(str::to_owned),
                        outcome: outcome.into(),
                    })
                    .collect()
            },
            |e| {
                let refused = wit::Outcome::StoreUnavailable(e.into());
                (0..n)
                    .map(|_| wit::Processed {
                        id: None,
                        outcome: refused.clone(),
                    })
                    .collect()
            },
        )
    }

    fn forget(id: String, options: wit::Options) -> Result<(), wit::StoreError> {
        <Component as guard::Guest>::forget(id, options)
    }
}
