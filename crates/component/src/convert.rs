//! Conversions between the core's types (`bq_dedupe`) and the WIT types of
//! `babelqueue:idempotency/types`. Pure data mapping: no decision is made here.

use std::time::Duration;

use bq_dedupe as bq;

use crate::bindings::babelqueue::idempotency::types as wit;

/// WIT durations are milliseconds. A `Duration` that came from milliseconds goes
/// back exactly; a longer one than `u64::MAX` ms cannot occur, but saturates.
pub fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// The core's `Options` from the WIT `options` record. An invalid `key-scope` is
/// refused as a store error of kind `invalid`, before anything reaches the store.
pub fn options(options: wit::Options) -> Result<bq::Options, bq::StoreError> {
    let mut keyspace = bq::KeySpace::new().with_prefix(options.key_prefix);
    if let Some(scope) = options.key_scope {
        keyspace = keyspace
            .with_scope(scope)
            .map_err(|e| bq::StoreError::new(bq::store::StoreErrorKind::Invalid, e.to_string()))?;
    }
    Ok(bq::Options {
        ttl: options.ttl_ms.map(Duration::from_millis),
        claim_lease: options.claim_lease_ms.map(Duration::from_millis),
        keyspace,
        limits: limits(options.max_bytes),
        leases: bq::LeasePolicy::default(),
        // The 1.x options record has no field for it.
        fingerprint: false,
    })
}

/// The core's `Options` from a `consumer.guard`'s `guard-options` (1.1.0): as
/// [`options`], plus payload fingerprints, which a build without the
/// `fingerprint` feature refuses as `unsupported`.
pub fn guard_options(options: wit::GuardOptions) -> Result<bq::Options, bq::StoreError> {
    if options.fingerprint && !cfg!(feature = "fingerprint") {
        return Err(bq::StoreError::unsupported(
            "payload fingerprints: this component was built without the `fingerprint` feature",
        ));
    }
    let fingerprint = options.fingerprint;
    let mut core = self::options(wit::Options {
        ttl_ms: options.ttl_ms,
        claim_lease_ms: options.claim_lease_ms,
        key_prefix: options.key_prefix,
        key_scope: options.key_scope,
        max_bytes: options.max_bytes,
    })?;
    core.fingerprint = fingerprint;
    Ok(core)
}

/// `max-bytes` (none: the core's default, 1 MiB).
pub fn limits(max_bytes: Option<u32>) -> bq::envelope::Limits {
    match max_bytes {
        Some(max) => bq::envelope::Limits {
            max_bytes: max as usize,
        },
        None => bq::envelope::Limits::default(),
    }
}

// ---- store errors, claims, capabilities (the imported `store`) ----

impl From<wit::StoreErrorKind> for bq::store::StoreErrorKind {
    fn from(kind: wit::StoreErrorKind) -> Self {
        match kind {
            wit::StoreErrorKind::Unavailable => bq::store::StoreErrorKind::Unavailable,
            wit::StoreErrorKind::Unsupported => bq::store::StoreErrorKind::Unsupported,
            wit::StoreErrorKind::Invalid => bq::store::StoreErrorKind::Invalid,
            wit::StoreErrorKind::Internal => bq::store::StoreErrorKind::Internal,
        }
    }
}

impl From<bq::store::StoreErrorKind> for wit::StoreErrorKind {
    fn from(kind: bq::store::StoreErrorKind) -> Self {
        match kind {
            bq::store::StoreErrorKind::Unavailable => wit::StoreErrorKind::Unavailable,
            bq::store::StoreErrorKind::Unsupported => wit::StoreErrorKind::Unsupported,
            bq::store::StoreErrorKind::Invalid => wit::StoreErrorKind::Invalid,
            bq::store::StoreErrorKind::Internal => wit::StoreErrorKind::Internal,
        }
    }
}

impl From<wit::StoreError> for bq::StoreError {
    fn from(e: wit::StoreError) -> Self {
        bq::StoreError::new(e.kind.into(), e.message)
    }
}

impl From<bq::StoreError> for wit::StoreError {
    fn from(e: bq::StoreError) -> Self {
        wit::StoreError {
            kind: e.kind.into(),
            message: e.message,
        }
    }
}

impl From<wit::Claim> for bq::store::Claim {
    fn from(claim: wit::Claim) -> Self {
        match claim {
            wit::Claim::Acquired(token) => bq::store::Claim::Acquired(bq::store::ClaimToken(token)),
            wit::Claim::Seen => bq::store::Claim::Seen,
            wit::Claim::Held => bq::store::Claim::Held,
        }
    }
}

impl From<wit::Capabilities> for bq::store::Capabilities {
    fn from(caps: wit::Capabilities) -> Self {
        bq::store::Capabilities {
            claim: caps.claim,
            ttl: caps.ttl,
            renew: false,
        }
    }
}

// ---- rejections ----

impl From<bq::envelope::Rejection> for wit::Rejection {
    fn from(r: bq::envelope::Rejection) -> Self {
        // By the shared kebab code (`tests/wit_contract.rs` keeps both lists equal).
        let code = match r.code() {
            "not-json" => wit::RejectionCode::NotJson,
            "not-an-object" => wit::RejectionCode::NotAnObject,
            "too-large" => wit::RejectionCode::TooLarge,
            "too-deep" => wit::RejectionCode::TooDeep,
            "missing-job" => wit::RejectionCode::MissingJob,
            "meta-not-object" => wit::RejectionCode::MetaNotObject,
            "unsupported-schema-version" => wit::RejectionCode::UnsupportedSchemaVersion,
            "data-not-object" => wit::RejectionCode::DataNotObject,
            "blank-trace-id" => wit::RejectionCode::BlankTraceId,
            "bad-attempts" => wit::RejectionCode::BadAttempts,
            // `Rejection` is non-exhaustive: a rule added to the core before the WIT
            // follows still arrives as a rejection; its message names the rule.
            _ => wit::RejectionCode::NotJson,
        };
        wit::Rejection {
            code,
            message: r.to_string(),
        }
    }
}

/// A core `Rejection` with the same code as a WIT one handed back by the host. Its
/// payload is a stand-in: the core's messages are generated from typed fields, so
/// the host's text cannot be carried through it. [`outcome_echoing`] puts the
/// host's original rejection back into the outcome.
fn rejection_stand_in(r: &wit::Rejection) -> bq::envelope::Rejection {
    let text = || r.message.clone();
    match r.code {
        wit::RejectionCode::NotJson => bq::envelope::Rejection::NotJson(text()),
        wit::RejectionCode::NotAnObject => bq::envelope::Rejection::NotAnObject,
        wit::RejectionCode::TooLarge => bq::envelope::Rejection::TooLarge { size: 0, limit: 0 },
        wit::RejectionCode::TooDeep => bq::envelope::Rejection::TooDeep {
            limit: bq::envelope::MAX_DEPTH,
        },
        wit::RejectionCode::MissingJob => bq::envelope::Rejection::MissingJob,
        wit::RejectionCode::MetaNotObject => bq::envelope::Rejection::MetaNotObject,
        wit::RejectionCode::UnsupportedSchemaVersion => {
            bq::envelope::Rejection::UnsupportedSchemaVersion { found: text() }
        }
        wit::RejectionCode::DataNotObject => {
            bq::envelope::Rejection::DataNotObject { found: text() }
        }
        wit::RejectionCode::BlankTraceId => bq::envelope::Rejection::BlankTraceId,
        wit::RejectionCode::BadAttempts => bq::envelope::Rejection::BadAttempts { found: text() },
    }
}

// ---- decisions (guard: decide -> host -> complete) ----

impl From<bq::guard::Verdict> for wit::Verdict {
    fn from(verdict: bq::guard::Verdict) -> Self {
        match verdict {
            bq::guard::Verdict::Run => wit::Verdict::Run,
            bq::guard::Verdict::FailOpen => wit::Verdict::FailOpen,
            bq::guard::Verdict::Skip => wit::Verdict::Skip,
            bq::guard::Verdict::Park => wit::Verdict::Park,
            // A component list never holds more than u32::MAX items.
            bq::guard::Verdict::Duplicate(of) => {
                wit::Verdict::Duplicate(u32::try_from(of).unwrap_or(u32::MAX))
            }
            bq::guard::Verdict::Reject(r) => wit::Verdict::Reject(r.into()),
            bq::guard::Verdict::StoreUnavailable(e) => wit::Verdict::StoreUnavailable(e.into()),
            bq::guard::Verdict::PayloadMismatch => wit::Verdict::PayloadMismatch,
        }
    }
}

impl From<bq::Decision> for wit::Decision {
    fn from(d: bq::Decision) -> Self {
        wit::Decision {
            verdict: d.verdict.into(),
            key: d.key,
            claim_token: d.claim.map(|token| token.0),
        }
    }
}

/// A decision the host handed back to `complete`/`complete-batch`, as the core's
/// type, plus the WIT rejection of a `reject` verdict to echo into its outcome.
pub struct Returned {
    pub decision: bq::Decision,
    pub rejection: Option<wit::Rejection>,
}

pub fn returned(d: wit::Decision) -> Returned {
    let mut rejection = None;
    let verdict = match d.verdict {
        wit::Verdict::Run => bq::guard::Verdict::Run,
        wit::Verdict::FailOpen => bq::guard::Verdict::FailOpen,
        wit::Verdict::Skip => bq::guard::Verdict::Skip,
        wit::Verdict::Park => bq::guard::Verdict::Park,
        wit::Verdict::Duplicate(of) => bq::guard::Verdict::Duplicate(of as usize),
        wit::Verdict::Reject(r) => {
            let stand_in = rejection_stand_in(&r);
            rejection = Some(r);
            bq::guard::Verdict::Reject(stand_in)
        }
        wit::Verdict::StoreUnavailable(e) => bq::guard::Verdict::StoreUnavailable(e.into()),
        wit::Verdict::PayloadMismatch => bq::guard::Verdict::PayloadMismatch,
    };
    Returned {
        decision: bq::Decision {
            verdict,
            key: d.key,
            claim: d.claim_token.map(bq::store::ClaimToken),
            // The WIT decision carries none: fingerprints stay off in the component.
            fingerprint: None,
            park_for: None,
            span: Default::default(),
        },
        rejection,
    }
}

/// A decision for every delivery of a call whose options were refused (or that
/// could not complete): do not run, retry.
pub fn refused_decision(error: bq::StoreError) -> wit::Decision {
    wit::Decision {
        verdict: wit::Verdict::StoreUnavailable(error.into()),
        key: None,
        claim_token: None,
    }
}

impl From<wit::HandlerResult> for bq::HandlerResult<String> {
    fn from(result: wit::HandlerResult) -> Self {
        match result {
            wit::HandlerResult::Ok => bq::HandlerResult::Ok,
            wit::HandlerResult::Failed(e) => bq::HandlerResult::Err(e),
            wit::HandlerResult::Panicked(msg) => bq::HandlerResult::Panicked(msg),
        }
    }
}

// ---- outcomes ----

/// The case names are `OutcomeKind::code()`.
impl From<bq::Outcome<String>> for wit::Outcome {
    fn from(outcome: bq::Outcome<String>) -> Self {
        match outcome {
            bq::Outcome::Ran => wit::Outcome::RunOk,
            bq::Outcome::RanUnrecorded(e) => wit::Outcome::RunOkUnrecorded(e.into()),
            bq::Outcome::RanLeaseLost => wit::Outcome::RunOkLeaseLost,
            bq::Outcome::Failed(e) => wit::Outcome::RunFailed(e),
            bq::Outcome::Panicked(msg) => wit::Outcome::RunPanicked(msg),
            aborted @ bq::Outcome::TransactionAborted(_) => {
                wit::Outcome::RunFailed(aborted.reason().unwrap_or_default())
            }
            bq::Outcome::Skipped => wit::Outcome::Skip,
            bq::Outcome::FailOpen(Ok(())) => wit::Outcome::FailOpen,
            bq::Outcome::FailOpen(Err(e)) => wit::Outcome::FailOpenFailed(e),
            bq::Outcome::Parked => wit::Outcome::Park,
            bq::Outcome::Rejected(r) => wit::Outcome::Rejected(r.into()),
            bq::Outcome::StoreUnavailable(e) => wit::Outcome::StoreUnavailable(e.into()),
            bq::Outcome::PayloadMismatch => wit::Outcome::PayloadMismatch,
        }
    }
}

/// The outcome of a returned decision: a `rejected` outcome carries the host's own
/// rejection (from the `reject` verdict) rather than the core's stand-in.
pub fn outcome_echoing(
    outcome: bq::Outcome<String>,
    rejection: Option<wit::Rejection>,
) -> wit::Outcome {
    match (outcome, rejection) {
        (bq::Outcome::Rejected(_), Some(original)) => wit::Outcome::Rejected(original),
        (outcome, _) => outcome.into(),
    }
}
