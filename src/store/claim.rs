//! What a claim or a peek answers.

use std::time::Duration;

use super::wire;

/// Proof of an in-flight claim, needed to release it (so only the owner can).
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct ClaimToken(pub String);

/// The answer to a claim attempt (on the wire, a [`wire::Claim`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(into = "wire::Claim", from = "wire::Claim")]
pub enum Claim {
    /// The id was free: the caller holds it until it remembers or releases it, or
    /// the lease runs out.
    Acquired(ClaimToken),
    /// The id was already remembered: skip.
    Seen,
    /// Another consumer holds a live claim on the id.
    Held,
}

/// What [`Store::peek_many`] sees of a key now (on the wire, a [`wire::Peek`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(into = "wire::Peek", from = "wire::Peek")]
pub enum Peeked {
    /// Remembered and not expired: skip.
    Done,
    /// Not done. `claim_ends_in`: a live claim holds the key and runs out in
    /// that long (`Some(ZERO)`: free, nobody holds it); `None`: the store cannot
    /// tell (the default `peek_many`), so it may be held for up to a lease.
    NotDone {
        /// How long the live claim on the key has left, where the store knows.
        claim_ends_in: Option<Duration>,
    },
}
