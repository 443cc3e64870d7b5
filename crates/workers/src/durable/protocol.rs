//! The batch RPC between [`super::DurableObjectStore`] and [`super::DedupeShard`]:
//! one JSON request, one JSON reply, every call for many keys.

use bq_dedupe::store::wire;
use serde::{Deserialize, Serialize};

/// The shapes this protocol shares with every store call on the wire.
pub use wire::{ClaimRef, PeekState, Remember};

/// The largest integer a JS number holds exactly: no duration or timestamp on the
/// wire, or stored by a shard, exceeds it (a row read back must still fit).
pub const MAX_SAFE_MS: u64 = (1 << 53) - 1;

/// A duration in whole milliseconds for the wire: at least 1, at most 2^53 - 1.
pub(crate) fn wire_ms(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_millis()).map_or(MAX_SAFE_MS, |ms| ms.clamp(1, MAX_SAFE_MS))
}

/// `now + ms`, kept within what a JS number (and so a row read back) holds exactly.
pub(crate) fn expiry_after(now: i64, ms: u64) -> i64 {
    now.saturating_add(i64::try_from(ms).unwrap_or(i64::MAX))
        .min(MAX_SAFE_MS as i64)
}

/// A request to one shard. Keys are exact store keys (any length).
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case", try_from = "FlatRequest")]
pub enum ShardRequest {
    /// Which keys are remembered (and not expired)?
    Seen {
        /// The keys to look up.
        keys: Vec<String>,
    },
    /// Atomically, for each key: seen, held by a live claim, or claimed now.
    Claim {
        /// The keys to claim.
        keys: Vec<String>,
        /// How long a new claim lasts, in ms.
        lease_ms: u64,
    },
    /// Remember `done` (for `ttl_ms`, or forever) and release the claims in
    /// `release` that the given tokens still own. (Sent by clients before
    /// `settle`; still answered.)
    Commit {
        /// The keys to remember.
        done: Vec<String>,
        /// How long `done` is remembered, in ms (`None`: forever).
        ttl_ms: Option<u64>,
        /// The claims to release.
        #[serde(default)]
        release: Vec<ClaimRef>,
    },
    /// One batch step, in this order: release the claims in `release` that their
    /// tokens still own; renew the claims in `renew` to `lease_ms` from now where
    /// their token still owns them (live, or lapsed and not taken over); remember
    /// `remember` (for `ttl_ms`, or forever), fenced where a token is given (see
    /// `bq_dedupe::Store::remember_fenced`). Reply: `kept` (one per remember) and
    /// `renewed` (one per renew).
    Settle(wire::Step),
    /// Read-only: for each key, remembered (`seen`), claimed by a live claim
    /// (`held`, with the ms it has left in `held_ms`) or neither (`free`). The
    /// guard's re-check of a held key, and asked of a previous layout while
    /// resharding.
    Peek {
        /// The keys to look at.
        keys: Vec<String>,
    },
    /// Drop keys and their claims.
    Forget {
        /// The keys to drop.
        keys: Vec<String>,
    },
    /// To the layout registry (`bq-dedupe/layouts`), from a consumer while
    /// resharding: its layout and the one before (as the settings name them),
    /// and the dedupe window. Reply: `refused`, why a second reshard inside
    /// one window is not allowed, or absent.
    Layouts {
        /// The consumer's layout ([`Layout::setting`](crate::shard::Layout::setting)).
        current: String,
        /// The layout before the change, named the same way (`None`: not
        /// resharding; still asked, so dropping it too early is refused).
        previous: Option<String>,
        /// The dedupe window, in ms (`None`: forever).
        window_ms: Option<u64>,
    },
    /// The rows (for inspection: the playground, `/store/entries`): live ones, or
    /// with `expired` also those past `expires_at` that the sweep has not removed.
    Entries {
        /// At most this many rows, in key order.
        limit: u32,
        /// Also the expired rows not yet swept.
        #[serde(default)]
        expired: bool,
    },
}

/// What a shard reads a request as: every op's fields side by side, the ones the
/// op names checked in [`ShardRequest::try_from`]. The same JSON as the tagged
/// enum, read without buffering it first (serde's internally tagged enums do),
/// which kept some 40 KB of deserializer in every module with a shard.
///
/// Every field present is type-checked, whatever the op: a field name means one
/// thing in every op, so a later op must not reuse a name with another type
/// (a shard of this version would refuse its requests).
#[derive(Deserialize)]
struct FlatRequest {
    op: Op,
    keys: Option<Vec<String>>,
    lease_ms: Option<u64>,
    done: Option<Vec<String>>,
    ttl_ms: Option<u64>,
    #[serde(default)]
    release: Vec<ClaimRef>,
    #[serde(default)]
    remember: Vec<Remember>,
    #[serde(default)]
    renew: Vec<ClaimRef>,
    current: Option<String>,
    previous: Option<String>,
    window_ms: Option<u64>,
    limit: Option<u32>,
    #[serde(default)]
    expired: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
enum Op {
    Seen,
    Claim,
    Commit,
    Settle,
    Peek,
    Forget,
    Layouts,
    Entries,
}

impl TryFrom<FlatRequest> for ShardRequest {
    type Error = String;

    fn try_from(r: FlatRequest) -> Result<Self, String> {
        let missing = |field: &str| format!("missing field `{field}`");
        let keys = || r.keys.ok_or_else(|| missing("keys"));
        Ok(match r.op {
            Op::Seen => ShardRequest::Seen { keys: keys()? },
            Op::Peek => ShardRequest::Peek { keys: keys()? },
            Op::Forget => ShardRequest::Forget { keys: keys()? },
            Op::Claim => ShardRequest::Claim {
                lease_ms: r.lease_ms.ok_or_else(|| missing("lease_ms"))?,
                keys: keys()?,
            },
            Op::Commit => ShardRequest::Commit {
                done: r.done.ok_or_else(|| missing("done"))?,
                ttl_ms: r.ttl_ms,
                release: r.release,
            },
            Op::Settle => ShardRequest::Settle(wire::Step {
                remember: r.remember,
                ttl_ms: r.ttl_ms,
                release: r.release,
                renew: r.renew,
                lease_ms: r.lease_ms,
            }),
            Op::Layouts => ShardRequest::Layouts {
                current: r.current.ok_or_else(|| missing("current"))?,
                previous: r.previous,
                window_ms: r.window_ms,
            },
            Op::Entries => ShardRequest::Entries {
                limit: r.limit.ok_or_else(|| missing("limit"))?,
                expired: r.expired,
            },
        })
    }
}

/// One live row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// The row's key.
    pub key: String,
    /// `done` (remembered) or `claimed` (in flight).
    pub state: String,
    /// Unix epoch milliseconds; `None`: never expires.
    pub expires_at: Option<u64>,
}

/// A shard's reply: the field for the request's op is set.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct ShardReply {
    /// `seen`: one per key, whether it is remembered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seen: Option<Vec<bool>>,
    /// `claim`: one per key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claims: Option<Vec<bq_dedupe::store::Claim>>,
    /// `settle`: one per `remember`; `false` where a fenced one's claim was lost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept: Option<Vec<bool>>,
    /// `settle`: one per `renew`, whether the claim was renewed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renewed: Option<Vec<bool>>,
    /// `peek`: one per key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peek: Option<Vec<PeekState>>,
    /// With `peek`: for each `held` key, the ms its claim has left (`None` for
    /// the others; absent from a shard of a version before it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_ms: Option<Vec<Option<u64>>>,
    /// `forget`: how many rows were deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forgotten: Option<u64>,
    /// `entries`: the rows, in key order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entries: Option<Vec<Entry>>,
    /// `layouts`: why the reshard is refused (absent: accepted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    /// Every op on the `ids` table: the rows it read and wrote, as the SQL API
    /// counts them (absent from a shard of a version before it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<crate::Rows>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use bq_dedupe::store::ClaimToken;
    use serde_json::{Value, json};

    fn claim_ref(key: &str) -> ClaimRef {
        ClaimRef {
            key: key.into(),
            token: ClaimToken(format!("t-{key}")),
        }
    }

    /// Every request a client sends, read back by a shard as the same request.
    #[test]
    fn a_shard_reads_every_request_as_sent() {
        let keys = || vec!["a".to_string(), "b".to_string()];
        let requests = [
            ShardRequest::Seen { keys: keys() },
            ShardRequest::Claim {
                keys: keys(),
                lease_ms: 30_000,
            },
            ShardRequest::Commit {
                done: keys(),
                ttl_ms: Some(5),
                release: vec![claim_ref("a")],
            },
            ShardRequest::Commit {
                done: vec![],
                ttl_ms: None,
                release: vec![],
            },
            ShardRequest::Settle(wire::Step {
                remember: vec![Remember {
                    key: "a".into(),
                    token: Some(ClaimToken("t".into())),
                }],
                ttl_ms: Some(7),
                release: vec![claim_ref("b")],
                renew: vec![claim_ref("c")],
                lease_ms: Some(9),
            }),
            ShardRequest::Settle(wire::Step::default()),
            ShardRequest::Peek { keys: keys() },
            ShardRequest::Forget { keys: vec![] },
            ShardRequest::Layouts {
                current: "2".into(),
                previous: Some("1".into()),
                window_ms: None,
            },
            ShardRequest::Entries {
                limit: 10,
                expired: true,
            },
        ];
        for request in requests {
            let sent = serde_json::to_value(&request).unwrap();
            let read: ShardRequest = serde_json::from_value(sent.clone()).unwrap();
            assert_eq!(serde_json::to_value(&read).unwrap(), sent, "{request:?}");
        }
    }

    /// A field an op needs is required; an unknown op or a field of the wrong
    /// type is refused; fields of older or newer deploys are ignored.
    #[test]
    fn a_shard_refuses_a_request_it_cannot_read() {
        let read = |v: Value| serde_json::from_value::<ShardRequest>(v).map_err(|e| e.to_string());
        for (request, error) in [
            (json!({"op": "seen"}), "missing field `keys`"),
            (
                json!({"op": "claim", "keys": []}),
                "missing field `lease_ms`",
            ),
            (json!({"op": "commit"}), "missing field `done`"),
            (json!({"op": "layouts"}), "missing field `current`"),
            (json!({"op": "entries"}), "missing field `limit`"),
            (json!({"op": "drop", "keys": []}), "unknown variant `drop`"),
            (json!({"keys": []}), "missing field `op`"),
            (json!({"op": "seen", "keys": "a"}), "invalid type"),
        ] {
            let got = read(request.clone()).unwrap_err();
            assert!(got.contains(error), "{request}: {got}");
        }
        let later = read(json!({"op": "seen", "keys": ["a"], "shard_hint": 3})).unwrap();
        assert!(matches!(later, ShardRequest::Seen { keys } if keys == ["a"]));
        // `release` defaults to none, as it did when it was added.
        let older = read(json!({"op": "commit", "done": ["a"], "ttl_ms": null})).unwrap();
        assert!(matches!(older, ShardRequest::Commit { release, .. } if release.is_empty()));
    }
}
