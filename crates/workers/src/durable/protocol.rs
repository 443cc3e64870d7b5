//! The batch RPC between [`super::DurableObjectStore`] and [`super::DedupeShard`]:
//! one JSON request, one JSON reply, every call for many keys.

use serde::{Deserialize, Serialize};

/// The largest integer a JS number holds exactly: no duration or timestamp on the
/// wire, or stored by a shard, exceeds it (a row read back must still fit).
pub const MAX_SAFE_MS: u64 = (1 << 53) - 1;

/// A request to one shard. Keys are exact store keys (any length).
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum ShardRequest {
    /// Which keys are remembered (and not expired)?
    Seen { keys: Vec<String> },
    /// Atomically, for each key: seen, held by a live claim, or claimed now.
    Claim { keys: Vec<String>, lease_ms: u64 },
    /// Remember `done` (for `ttl_ms`, or forever) and release the claims in
    /// `release` that the given tokens still own.
    Commit {
        done: Vec<String>,
        ttl_ms: Option<u64>,
        #[serde(default)]
        release: Vec<Release>,
    },
    /// Drop keys and their claims.
    Forget { keys: Vec<String> },
    /// The rows (for inspection: the playground, `/store/entries`): live ones, or
    /// with `expired` also those past `expires_at` that the sweep has not removed.
    Entries {
        limit: u32,
        #[serde(default)]
        expired: bool,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Release {
    pub key: String,
    pub token: String,
}

/// A claim attempt's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum ClaimReply {
    Acquired { token: String },
    Seen,
    Held,
}

/// One live row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub key: String,
    /// `done` (remembered) or `claimed` (in flight).
    pub state: String,
    /// Unix epoch milliseconds; `None`: never expires.
    pub expires_at: Option<u64>,
}

/// A shard's reply: the field for the request's op is set.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct ShardReply {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seen: Option<Vec<bool>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claims: Option<Vec<ClaimReply>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forgotten: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entries: Option<Vec<Entry>>,
}
