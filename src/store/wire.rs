//! The store calls' JSON shapes, written once: the Durable Object protocol, the
//! example worker's `/store/*` routes and their native client (the workerd
//! testkit) send these, and the JS store protocol builds the same objects from
//! the codes here. Old and new deploys read each other's messages: add fields
//! with defaults, never rename one.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{
    ClaimToken, Peeked, Settlement, Store, StoreError, StoreErrorKind, StoreResult, TxRun,
};

/// Whole milliseconds, saturating.
pub fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A claim's answer: `{"state":"acquired","token":T}`, `{"state":"seen"}` or
/// `{"state":"held"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum Claim {
    /// Claimed now, by this token.
    Acquired {
        /// What releases, renews or fences the claim.
        token: ClaimToken,
    },
    /// Already remembered: not claimed.
    Seen,
    /// Held by a live claim: not claimed.
    Held,
}

impl Claim {
    /// The `state` code and token (for a host that builds the object itself).
    pub fn parts(claim: &super::Claim) -> (&'static str, Option<&str>) {
        match claim {
            super::Claim::Acquired(token) => ("acquired", Some(&token.0)),
            super::Claim::Seen => ("seen", None),
            super::Claim::Held => ("held", None),
        }
    }

    /// A claim from its `state` code and (read only for `acquired`) its token.
    pub fn from_parts(
        state: Option<&str>,
        token: impl FnOnce() -> Option<String>,
    ) -> StoreResult<super::Claim> {
        match state {
            Some("seen") => Ok(super::Claim::Seen),
            Some("held") => Ok(super::Claim::Held),
            Some("acquired") => token()
                .map(|t| super::Claim::Acquired(ClaimToken(t)))
                .ok_or_else(|| StoreError::internal("claim: acquired without a string token")),
            _ => Err(StoreError::internal(
                "claim: expected {state: \"acquired\"|\"seen\"|\"held\"}",
            )),
        }
    }
}

impl From<super::Claim> for Claim {
    fn from(claim: super::Claim) -> Self {
        match claim {
            super::Claim::Acquired(token) => Claim::Acquired { token },
            super::Claim::Seen => Claim::Seen,
            super::Claim::Held => Claim::Held,
        }
    }
}

impl From<Claim> for super::Claim {
    fn from(claim: Claim) -> Self {
        match claim {
            Claim::Acquired { token } => super::Claim::Acquired(token),
            Claim::Seen => super::Claim::Seen,
            Claim::Held => super::Claim::Held,
        }
    }
}

/// A peek's answer: `{"state":"done"}` or `{"state":"not-done",
/// "claim_ends_in_ms": ms}` (0: free; `null`: the store cannot tell).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum Peek {
    /// Remembered and not expired.
    Done,
    /// Not done; how long a live claim has left, where the store knows.
    NotDone {
        /// In ms.
        claim_ends_in_ms: Option<u64>,
    },
}

impl From<Peeked> for Peek {
    fn from(peeked: Peeked) -> Self {
        match peeked {
            Peeked::Done => Peek::Done,
            Peeked::NotDone { claim_ends_in } => Peek::NotDone {
                claim_ends_in_ms: claim_ends_in.map(ms),
            },
        }
    }
}

impl From<Peek> for Peeked {
    fn from(peek: Peek) -> Self {
        match peek {
            Peek::Done => Peeked::Done,
            Peek::NotDone { claim_ends_in_ms } => Peeked::NotDone {
                claim_ends_in: claim_ends_in_ms.map(Duration::from_millis),
            },
        }
    }
}

/// The Durable Object protocol's peek (older than [`Peek`], and kept for
/// shards of other deploys): a state per key, and the ms a `held` claim has
/// left in a list beside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PeekState {
    /// Neither remembered nor held by a live claim.
    Free,
    /// Remembered (and not expired).
    Seen,
    /// Held by a live claim.
    Held,
}

impl PeekState {
    /// The state of `peeked`, and the ms its claim has left if held.
    pub fn of(peeked: Peeked) -> (PeekState, Option<u64>) {
        match peeked {
            Peeked::Done => (PeekState::Seen, None),
            Peeked::NotDone {
                claim_ends_in: Some(Duration::ZERO),
            } => (PeekState::Free, None),
            Peeked::NotDone { claim_ends_in } => (PeekState::Held, claim_ends_in.map(ms)),
        }
    }

    /// What the state says, with `held_ms` (`None`: held, for how long unknown).
    pub fn peeked(self, held_ms: Option<u64>) -> Peeked {
        let claim_ends_in = match self {
            PeekState::Seen => return Peeked::Done,
            PeekState::Free => Some(Duration::ZERO),
            PeekState::Held => held_ms.map(Duration::from_millis),
        };
        Peeked::NotDone { claim_ends_in }
    }
}

/// A claim by its key and token: one to release, or to renew.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimRef {
    /// The claimed key.
    pub key: String,
    /// The token the claim was acquired with.
    pub token: ClaimToken,
}

/// A key to remember; with a token, fenced by that claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Remember {
    /// The key to remember.
    pub key: String,
    /// The claim that must still own the key (`None`: not fenced).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<ClaimToken>,
}

/// One batch step ([`Settlement`]): `{"remember": [{key, token?}], "ttl_ms",
/// "release": [{key, token}], "renew": [{key, token}], "lease_ms"}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    /// The keys to remember (last).
    #[serde(default)]
    pub remember: Vec<Remember>,
    /// How long `remember` is remembered, in ms (`None`: forever).
    #[serde(default)]
    pub ttl_ms: Option<u64>,
    /// The claims to release (first).
    #[serde(default)]
    pub release: Vec<ClaimRef>,
    /// The claims to renew.
    #[serde(default)]
    pub renew: Vec<ClaimRef>,
    /// How long a renewed claim lasts from now, in ms (absent: the reader's
    /// default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_ms: Option<u64>,
}

impl From<&Settlement<'_>> for Step {
    fn from(step: &Settlement<'_>) -> Self {
        let refs = |claims: &[(&str, &ClaimToken)]| {
            let claim = |(key, token): &(&str, &ClaimToken)| ClaimRef {
                key: key.to_string(),
                token: (*token).clone(),
            };
            claims.iter().map(claim).collect()
        };
        Step {
            remember: (step.remember.iter())
                .map(|(key, token)| Remember {
                    key: key.to_string(),
                    token: token.cloned(),
                })
                .collect(),
            ttl_ms: step.ttl.map(ms),
            release: refs(step.release),
            renew: refs(step.renew),
            lease_ms: Some(ms(step.lease)),
        }
    }
}

impl Step {
    /// Settles this step on `store` (without `lease_ms`, renewing to `lease`).
    pub async fn apply<S: Store + ?Sized>(
        &self,
        store: &S,
        lease: Duration,
    ) -> StoreResult<super::Settled> {
        fn pairs(refs: &[ClaimRef]) -> Vec<(&str, &ClaimToken)> {
            refs.iter().map(|r| (r.key.as_str(), &r.token)).collect()
        }
        let remember: Vec<(&str, Option<&ClaimToken>)> = (self.remember.iter())
            .map(|r| (r.key.as_str(), r.token.as_ref()))
            .collect();
        let (release, renew) = (pairs(&self.release), pairs(&self.renew));
        let step = Settlement {
            remember: &remember,
            ttl: self.ttl_ms.map(Duration::from_millis),
            release: &release,
            renew: &renew,
            lease: self.lease_ms.map_or(lease, Duration::from_millis),
        };
        store.settle(&step).await
    }
}

/// What a step found: `{"kept": [..], "release_error": text | null,
/// "renewed": [..]}` (the release error as a [`StoreError`] displays).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settled {
    /// One per remember.
    pub kept: Vec<bool>,
    /// A release that failed.
    #[serde(default)]
    pub release_error: Option<String>,
    /// One per renewal.
    pub renewed: Vec<bool>,
}

impl From<super::Settled> for Settled {
    fn from(settled: super::Settled) -> Self {
        Settled {
            kept: settled.kept,
            release_error: settled.release_error.map(|e| e.to_string()),
            renewed: settled.renewed,
        }
    }
}

impl Settled {
    /// The core's answer to `step`: `Err` unless there is one answer per entry.
    pub fn answering(self, step: &Settlement<'_>) -> StoreResult<super::Settled> {
        let (kept, renewed) = (step.remember.len(), step.renew.len());
        if self.kept.len() != kept || self.renewed.len() != renewed {
            return Err(StoreError::internal(format!(
                "settle: expected {kept} kept and {renewed} renewed, got {self:?}"
            )));
        }
        Ok(super::Settled {
            kept: self.kept,
            renewed: self.renewed,
            release_error: self.release_error.as_deref().map(error_from_text),
        })
    }
}

/// A store error from its displayed text (`store KIND: MESSAGE`); text not of
/// that form is an `unavailable` error saying it.
pub fn error_from_text(text: &str) -> StoreError {
    let parsed = text.strip_prefix("store ").and_then(|rest| {
        let (code, message) = rest.split_once(": ")?;
        Some(StoreError::new(StoreErrorKind::from_code(code)?, message))
    });
    parsed.unwrap_or_else(|| StoreError::unavailable(text))
}

/// A store error: `{"error": message, "kind": code}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Error {
    /// What the backend said.
    pub error: String,
    /// [`StoreErrorKind::code`].
    pub kind: StoreErrorKind,
}

impl From<StoreError> for Error {
    fn from(e: StoreError) -> Self {
        Error {
            error: e.message,
            kind: e.kind,
        }
    }
}

impl From<Error> for StoreError {
    fn from(e: Error) -> Self {
        StoreError::new(e.kind, e.error)
    }
}

/// How a transactional run ended: `"committed"`, `"already-done"`, `"held"`,
/// `"rolled-back"`, or `{"aborted": error}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Run {
    /// The work and the id committed together.
    Committed,
    /// The id was already remembered: the work did not run.
    AlreadyDone,
    /// Another consumer holds the id.
    Held,
    /// The work failed; nothing was kept.
    RolledBack,
    /// The store failed; nothing was kept.
    Aborted(Error),
}

impl<T, E> From<TxRun<T, E>> for Run {
    fn from(run: TxRun<T, E>) -> Self {
        match run {
            TxRun::Committed(_) => Run::Committed,
            TxRun::AlreadyDone => Run::AlreadyDone,
            TxRun::Held => Run::Held,
            TxRun::RolledBack(_) => Run::RolledBack,
            TxRun::Aborted(e) => Run::Aborted(e.into()),
        }
    }
}

impl From<Run> for TxRun<(), ()> {
    fn from(run: Run) -> Self {
        match run {
            Run::Committed => TxRun::Committed(()),
            Run::AlreadyDone => TxRun::AlreadyDone,
            Run::Held => TxRun::Held,
            Run::RolledBack => TxRun::RolledBack(()),
            Run::Aborted(e) => TxRun::Aborted(e.into()),
        }
    }
}

/// A batch call's keys: `{"keys": [..], "ttl_ms"?, "lease_ms"?}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Keys {
    /// The keys.
    pub keys: Vec<String>,
    /// A remember's TTL, in ms (`None`: forever).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    /// A claim's lease, in ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_ms: Option<u64>,
}

impl Keys {
    /// The keys as the store's calls take them.
    pub fn refs(&self) -> Vec<&str> {
        self.keys.iter().map(String::as_str).collect()
    }
}

/// The testkit's transactional call: one effect for `key` and the key in one
/// transaction, the work failing when `ok` is false.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transact {
    /// The key.
    pub key: String,
    /// How long the key is remembered, in ms (`None`: forever).
    #[serde(default)]
    pub ttl_ms: Option<u64>,
    /// Whether the work succeeds.
    pub ok: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_are_the_contract() {
        let claim = Claim::from(super::super::Claim::Acquired(ClaimToken("t".into())));
        let json = serde_json::to_string(&claim).unwrap();
        assert_eq!(json, r#"{"state":"acquired","token":"t"}"#);
        assert_eq!(
            serde_json::to_string(&Claim::Held).unwrap(),
            r#"{"state":"held"}"#
        );
        let peek = Peek::from(Peeked::NotDone {
            claim_ends_in: None,
        });
        let json = serde_json::to_string(&peek).unwrap();
        assert_eq!(json, r#"{"state":"not-done","claim_ends_in_ms":null}"#);
        let step: Step = serde_json::from_str("{}").unwrap();
        assert_eq!(step, Step::default());
        let run = serde_json::to_string(&Run::AlreadyDone).unwrap();
        assert_eq!(run, r#""already-done""#);
    }

    #[test]
    fn error_kinds_are_their_codes() {
        for kind in [
            StoreErrorKind::Unavailable,
            StoreErrorKind::Unsupported,
            StoreErrorKind::Invalid,
            StoreErrorKind::Internal,
        ] {
            let json = serde_json::to_string(&kind).unwrap();
            assert_eq!(json, format!("\"{}\"", kind.code()));
            assert_eq!(StoreErrorKind::from_code(kind.code()), Some(kind));
            let e = StoreError::new(kind, "a: b");
            assert_eq!(error_from_text(&e.to_string()), e);
        }
        assert_eq!(error_from_text("x"), StoreError::unavailable("x"));
    }
}
