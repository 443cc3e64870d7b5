//! The store calls' JSON shapes, written once: the Durable Object protocol, the
//! fixture worker's `/store/*` routes and their native client (the workerd
//! testkit) send these, and the JS store protocol builds the same objects from
//! the codes here. Deploys of other versions read them: add fields with
//! defaults, never rename one. A [`StoreError`] is `{"error": message, "kind":
//! code}`, a [`ClaimToken`] a string.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{
    ClaimToken, Peeked, Settlement, Store, StoreError, StoreErrorKind, StoreResult, TxRun,
};

/// Whole milliseconds, saturating.
pub fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A claim's answer: `{"state": "acquired", "token": T}`, `{"state": "seen"}`
/// or `{"state": "held"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
#[allow(missing_docs)] // The core's `Claim`, variant for variant.
pub enum Claim {
    Acquired { token: ClaimToken },
    Seen,
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
        let claim = match state {
            Some("seen") => super::Claim::Seen,
            Some("held") => super::Claim::Held,
            Some("acquired") => {
                super::Claim::Acquired(ClaimToken(token().ok_or_else(|| {
                    StoreError::internal("claim: acquired without a string token")
                })?))
            }
            _ => Err(StoreError::internal(
                "claim: expected {state: \"acquired\"|\"seen\"|\"held\"}",
            ))?,
        };
        Ok(claim)
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

/// A peek's answer: `{"state": "done"}` or `{"state": "not-done",
/// "claim_ends_in_ms": ms}` (0: free; `null`: the store cannot tell).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
#[allow(missing_docs)] // The core's `Peeked`, in ms.
pub enum Peek {
    Done,
    NotDone { claim_ends_in_ms: Option<u64> },
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

/// The Durable Object protocol's peek, older than [`Peek`] and kept for shards
/// of other deploys: `"free"`, `"seen"` or `"held"` per key, and the ms a held
/// claim has left in a list beside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[allow(missing_docs)]
pub enum PeekState {
    Free,
    Seen,
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

/// A claim to release or renew: `{"key", "token"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct ClaimRef {
    pub key: String,
    pub token: ClaimToken,
}

/// A key to remember, fenced by a claim where it has a token: `{"key", "token"?}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct Remember {
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<ClaimToken>,
}

/// One batch step, the core's [`Settlement`] in ms (`ttl_ms` `null`: forever;
/// `lease_ms` absent: the reader's default).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct Step {
    #[serde(default)]
    pub remember: Vec<Remember>,
    #[serde(default)]
    pub ttl_ms: Option<u64>,
    #[serde(default)]
    pub release: Vec<ClaimRef>,
    #[serde(default)]
    pub renew: Vec<ClaimRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_ms: Option<u64>,
}

impl From<&Settlement<'_>> for Step {
    fn from(step: &Settlement<'_>) -> Self {
        let refs = |claims: &[(&str, &ClaimToken)]| {
            let claim = |&(key, token): &(&str, &ClaimToken)| ClaimRef {
                key: key.into(),
                token: token.clone(),
            };
            claims.iter().map(claim).collect()
        };
        let remember = |&(key, token): &(&str, Option<&ClaimToken>)| Remember {
            key: key.into(),
            token: token.cloned(),
        };
        Step {
            remember: step.remember.iter().map(remember).collect(),
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

/// What a step found: `{"kept", "release_error", "renewed"}`, the release
/// error as text (as a [`StoreError`] displays).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct Settled {
    pub kept: Vec<bool>,
    #[serde(default)]
    pub release_error: Option<String>,
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
    /// The release error's kind is read back from its text (else `unavailable`).
    pub fn answering(self, step: &Settlement<'_>) -> StoreResult<super::Settled> {
        if (self.kept.len(), self.renewed.len()) != (step.remember.len(), step.renew.len()) {
            return Err(StoreError::internal(format!(
                "settle: one answer per entry, not {self:?}"
            )));
        }
        let error = |text: &str| {
            let (code, message) = text.strip_prefix("store ")?.split_once(": ")?;
            Some(StoreError::new(StoreErrorKind::from_code(code)?, message))
        };
        Ok(super::Settled {
            release_error: (self.release_error.as_deref())
                .map(|text| error(text).unwrap_or_else(|| StoreError::unavailable(text))),
            kept: self.kept,
            renewed: self.renewed,
        })
    }
}

/// How a transactional run ended: `"committed"`, `"already-done"`, `"held"`,
/// `"rolled-back"`, or `{"aborted": store error}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[allow(missing_docs)] // The core's `TxRun`, without the work's values.
pub enum Run {
    Committed,
    AlreadyDone,
    Held,
    RolledBack,
    Aborted(StoreError),
}

impl<T, E> From<TxRun<T, E>> for Run {
    fn from(run: TxRun<T, E>) -> Self {
        match run {
            TxRun::Committed(_) => Run::Committed,
            TxRun::AlreadyDone => Run::AlreadyDone,
            TxRun::Held => Run::Held,
            TxRun::RolledBack(_) => Run::RolledBack,
            TxRun::Aborted(e) => Run::Aborted(e),
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
            Run::Aborted(e) => TxRun::Aborted(e),
        }
    }
}

/// A batch call's keys: `{"keys", "ttl_ms"?, "lease_ms"?}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct Keys {
    pub keys: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
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
/// transaction, the work failing when `ok` is false; `claim`, the run's own
/// claim on `key`, where it took one (the commit clears it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct Transact {
    pub key: String,
    #[serde(default)]
    pub ttl_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<ClaimToken>,
    pub ok: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(value: &impl Serialize) -> String {
        serde_json::to_string(value).unwrap()
    }

    #[test]
    fn shapes_are_the_contract() {
        let claim = super::super::Claim::Acquired(ClaimToken("t".into()));
        assert_eq!(json(&claim), r#"{"state":"acquired","token":"t"}"#);
        let held: super::super::Claim = serde_json::from_str(r#"{"state":"held"}"#).unwrap();
        assert_eq!(held, super::super::Claim::Held);
        let peek = json(&Peeked::NotDone {
            claim_ends_in: None,
        });
        assert_eq!(peek, r#"{"state":"not-done","claim_ends_in_ms":null}"#);
        assert_eq!(json(&Run::AlreadyDone), r#""already-done""#);
        let e = StoreError::new(StoreErrorKind::Invalid, "no: key");
        assert_eq!(json(&e), r#"{"error":"no: key","kind":"invalid"}"#);
        assert_eq!(serde_json::from_str::<Step>("{}").unwrap(), Step::default());
        let settled = Settled {
            release_error: Some(e.to_string()),
            ..Settled::default()
        };
        let settled = settled.answering(&Settlement::default()).unwrap();
        assert_eq!(settled.release_error, Some(e));
        for kind in [StoreErrorKind::Unavailable, StoreErrorKind::Internal] {
            assert_eq!(StoreErrorKind::from_code(kind.code()), Some(kind));
        }
    }
}
