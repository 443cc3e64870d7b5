//! The three record formats a [`super::RedisStore`] reads and writes, and what a
//! stored value is in each.

use bq_dedupe::store::ClaimToken;

/// Whose records a [`RedisStore`] reads and writes (see `docs/stores.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Dialect {
    /// bq-dedupe's own: `c:<token>` while claimed, `d:<token>` once that claim
    /// is committed (`d` when remembered without a claim), under `bq:dedupe:` (a
    /// prefix no other SDK uses). Claims have owners: renewals and commits are
    /// fenced by token, and a commit sent again finds its own `d:<token>`. A value under the prefix that is neither
    /// is a store error (`Internal`) at a read or claim, never read as a claim
    /// or as seen; at a fenced commit or renewal, the claim's end (nothing written).
    #[default]
    Native,
    /// The PHP SDK's `RedisStore`: `1` while claimed (the lease is the key's
    /// expiry), `2` once remembered, under `bq:idem:`. No owner token: a release,
    /// renewal or commit cannot tell two claimers apart, so the store reports
    /// `renew: false` (claims are not renewed; commits are fenced by the value
    /// alone, `Store::fences_commits`: a claim gone or done by another is told,
    /// one another consumer took is not; use a lease longer than the slowest
    /// batch, PHP's default is 3600 s). A value that is neither `1` nor `2` is a
    /// store error at a read or claim, the claim's end at a fenced commit.
    Php,
    /// The Go SDK's Redis store: `1` once remembered (`seen` is `EXISTS`, as in
    /// Go: any value counts), under `bq:idemp:`. No in-flight state: `claim` is
    /// refused (`Unsupported`, capability `claim: false`); plain mode works.
    Go,
}

impl Dialect {
    /// Every dialect.
    pub const ALL: [Dialect; 3] = [Dialect::Native, Dialect::Php, Dialect::Go];

    /// The name in a spec (`?dialect=`).
    pub fn name(self) -> &'static str {
        match self {
            Dialect::Native => "native",
            Dialect::Php => "php",
            Dialect::Go => "go",
        }
    }

    /// The dialect a spec names, if any.
    pub fn from_name(name: &str) -> Option<Dialect> {
        match name {
            "native" | "bq-dedupe" => Some(Dialect::Native),
            "php" => Some(Dialect::Php),
            "go" => Some(Dialect::Go),
            _ => None,
        }
    }

    /// The key prefix used when a spec gives none: the one each SDK writes.
    pub fn default_prefix(self) -> &'static str {
        match self {
            Dialect::Native => "bq:dedupe:",
            Dialect::Php => "bq:idem:",
            Dialect::Go => "bq:idemp:",
        }
    }

    /// The value of a remembered key.
    pub(super) fn done(self) -> &'static [u8] {
        match self {
            Dialect::Native => b"d",
            Dialect::Php => b"2",
            Dialect::Go => b"1",
        }
    }

    /// The value a fenced commit by `token` leaves: `d:<token>` in our format
    /// (so the same commit sent again is known as ours), else [`Self::done`].
    pub(super) fn done_by(self, token: &ClaimToken) -> Vec<u8> {
        match self {
            Dialect::Native => format!("d:{}", token.0).into_bytes(),
            _ => self.done().to_vec(),
        }
    }

    /// The value of a claim, for the Lua scripts' `ARGV[1]`.
    pub(super) fn claim_value(self, token: &ClaimToken) -> Vec<u8> {
        match self {
            Dialect::Native => format!("c:{}", token.0).into_bytes(),
            Dialect::Php | Dialect::Go => b"1".to_vec(),
        }
    }

    /// The scripts' foreign-value test: `n` for ours, `p` for PHP's.
    pub(super) fn mode(self) -> &'static str {
        match self {
            Dialect::Native => "n",
            _ => "p",
        }
    }

    /// What a stored value is, in this dialect.
    pub(super) fn read(self, value: &[u8]) -> Record {
        match self {
            Dialect::Native if value == b"d" || value.starts_with(b"d:") => Record::Done,
            Dialect::Native if value.starts_with(b"c:") => Record::Claimed,
            Dialect::Php if value == b"2" => Record::Done,
            Dialect::Php if value == b"1" => Record::Claimed,
            Dialect::Go => Record::Done,
            _ => Record::Foreign,
        }
    }
}

/// A stored value, read in a dialect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Record {
    Done,
    Claimed,
    Foreign,
}
