//! One batch step's writes ([`Settlement`]) and what the store found ([`Settled`]).

use std::time::Duration;

use super::{ClaimToken, StoreError};

/// The writes of one batch step, applied by [`Store::settle`] in one call where
/// the backend can (one transaction, one script, one request per shard).
#[derive(Debug, Clone, Copy, Default)]
pub struct Settlement<'a> {
    /// Keys whose handler succeeded. With a token (claiming mode) the key is
    /// remembered fenced: see [`Store::remember_fenced`]. Without one, plainly.
    pub remember: &'a [(&'a str, Option<&'a ClaimToken>)],
    /// How long remembered keys count as seen (`None`: until forgotten).
    pub ttl: Option<Duration>,
    /// Claims to give up (their handler failed or did not run).
    pub release: &'a [(&'a str, &'a ClaimToken)],
    /// Claims to extend to `lease` from now, where their token still owns them.
    pub renew: &'a [(&'a str, &'a ClaimToken)],
    /// The lease `renew` extends to.
    pub lease: Duration,
}

/// What [`Store::settle`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settled {
    /// One per `remember` entry: `true` if the id was recorded under its own
    /// claim (always `true` without a token); `false` if the claim had been lost.
    pub kept: Vec<bool>,
    /// One per `renew` entry: `true` if the claim is still ours and now lasts
    /// another lease; `false` if it was lost.
    pub renewed: Vec<bool>,
    /// A release that failed. It changes no outcome (the lease runs out by
    /// itself), so it is reported here instead of failing the settlement.
    pub release_error: Option<StoreError>,
}
