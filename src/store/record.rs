//! The rules of one key's record, stated once.
//!
//! Every store keeps, per key, one [`Record`]: free, claimed by a token until
//! some time, or done (remembered) until some time or forever. Every store
//! operation is a function of that record, the caller's arguments and the time;
//! this module is those functions. The in-memory store applies them directly;
//! the stores with their own encodings (SQLite rows, Redis values and Lua,
//! PostgreSQL rows, the Durable Object's table) are checked against them by the
//! store testkit (`crates/testkit`). `docs/stores.md` has the same rules as a
//! table.
//!
//! Two things a backend may do differently, both named by [`Rules`]:
//! - a claim whose lease has run out (*lapsed*) is either kept until someone
//!   takes it over (SQL rows: its owner can still renew or commit it), or
//!   dropped at once (Redis deletes an expired key: its owner finds it gone);
//! - a done record either remembers the token that committed it (so a commit
//!   re-sent after a lost reply is recognised as ours) or not.
//!
//! Times are milliseconds on the store's clock; `None` for a deadline means
//! never, and `None` for `now` means the store has no clock (nothing lapses).

use std::time::Duration;

use super::{Claim, ClaimToken, Peeked};

/// One key's record. `T` is the claim token as the backend holds it (a
/// [`ClaimToken`], or the in-memory store's number).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Record<T = ClaimToken> {
    /// No record: never seen, forgotten, released, or expired and gone.
    #[default]
    Free,
    /// In flight: `token` holds the key until `until` (then it has lapsed).
    Claimed {
        /// The owner's proof.
        token: T,
        /// When the lease runs out (`None`: never).
        until: Option<u64>,
    },
    /// Remembered: seen until `until` (`None`: until forgotten).
    Done {
        /// When it stops counting as seen.
        until: Option<u64>,
        /// The claim token whose fenced commit wrote it, where the backend keeps
        /// it ([`Rules::done_keeps_token`]); `None` for a plain remember.
        by: Option<T>,
    },
}

/// What [`Record::claim`] answered; [`ClaimAnswer::with_token`] makes it the
/// store's [`Claim`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimAnswer {
    /// The key is now claimed by the caller's token.
    Acquired,
    /// Done: skip.
    Seen,
    /// Another live claim holds it.
    Held,
}

impl ClaimAnswer {
    /// The store's answer, `token` being the one the claim was taken with.
    pub fn with_token(self, token: ClaimToken) -> Claim {
        match self {
            ClaimAnswer::Acquired => Claim::Acquired(token),
            ClaimAnswer::Seen => Claim::Seen,
            ClaimAnswer::Held => Claim::Held,
        }
    }
}

/// How a backend's encoding bends the rules where the rules allow a choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    /// A lapsed claim stays its owner's until another consumer takes the key
    /// (`true`: SQL rows), or is gone the moment it lapses (`false`: Redis).
    pub lapsed_claim_kept: bool,
    /// A fenced commit records its token, so the same commit sent again finds
    /// the key done *by this token* and answers `true`.
    pub done_keeps_token: bool,
    /// A claim's value names its owner. `false` (the PHP SDK's `1`): every claim
    /// looks alike, so a release ends whichever claim is there, and renewals and
    /// fenced commits are not offered (`Capabilities::lease` is false).
    pub claims_have_owners: bool,
    /// A plain `remember` of a key that is already done and live sets its
    /// expiry anew (`true`), or leaves the earlier one (`false`: the Go SDK's
    /// PostgreSQL statement, `ON CONFLICT ... WHERE expires_at <= now()`).
    pub remember_resets_expiry: bool,
    /// A lapsed claim that `lapsed_claim_kept` keeps may also vanish at any
    /// moment after it lapses (`true`: the Durable Object's alarm sweeps expired
    /// rows), so its owner's renewal or fenced commit may find it gone.
    pub lapsed_claim_swept: bool,
    /// A claim is taken before the store has checked whether the key was done
    /// meanwhile, and given back if it was (PostgreSQL at `READ COMMITTED`:
    /// two statements), so a claim (or a transactional run, or a peek) made
    /// in between may find a free key held. Such a `Held` parks a message
    /// that could have run; it never runs one twice.
    pub claim_given_back: bool,
}

impl Rules {
    /// Every choice at its strictest: lapsed claims kept, done records keep
    /// their token, claims have owners, `remember` resets the expiry (SQLite's
    /// rules; see each store's own `RULES` for the others).
    pub const KEPT: Rules = Rules {
        lapsed_claim_kept: true,
        done_keeps_token: true,
        claims_have_owners: true,
        remember_resets_expiry: true,
        lapsed_claim_swept: false,
        claim_given_back: false,
    };
}

/// What [`Record::peek`] sees: the state as a reader would judge it now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peek {
    /// Free (or expired): a claim would be granted.
    Free,
    /// A live claim (another `claim` answers `Held`).
    Claimed,
    /// Done and not expired.
    Done,
}

fn live(until: Option<u64>, now: Option<u64>) -> bool {
    match (until, now) {
        (Some(until), Some(now)) => now < until,
        _ => true,
    }
}

impl<T: Clone + PartialEq> Record<T> {
    /// The record as every operation judges it at `now`: an expired done record
    /// is free; a lapsed claim is free, or gone, per `rules`.
    fn settled(&mut self, rules: Rules, now: Option<u64>) {
        let gone = match self {
            Record::Done { until, .. } => !live(*until, now),
            Record::Claimed { until, .. } => !rules.lapsed_claim_kept && !live(*until, now),
            Record::Free => false,
        };
        if gone {
            *self = Record::Free;
        }
    }

    /// Whether `token` owns this record's claim (live, or lapsed and kept).
    pub fn claimed_by(&self, token: &T) -> bool {
        matches!(self, Record::Claimed { token: t, .. } if t == token)
    }

    /// `seen`: done and not expired.
    pub fn seen(&self, now: Option<u64>) -> bool {
        self.peek(now) == Peek::Done
    }

    /// The state a reader sees at `now`.
    pub fn peek(&self, now: Option<u64>) -> Peek {
        match self {
            Record::Done { until, .. } if live(*until, now) => Peek::Done,
            Record::Claimed { until, .. } if live(*until, now) => Peek::Claimed,
            _ => Peek::Free,
        }
    }

    /// `peek_many`'s answer: done, or how long a live claim has left (`ZERO`:
    /// free; `None`: a claim that never runs out, or no clock to tell).
    pub fn peeked(&self, now: Option<u64>) -> Peeked {
        let claim_ends_in = match (self.peek(now), self, now) {
            (Peek::Done, ..) => return Peeked::Done,
            (Peek::Free, ..) => Some(Duration::ZERO),
            (Peek::Claimed, Record::Claimed { until: Some(u), .. }, Some(now)) => {
                Some(Duration::from_millis(u.saturating_sub(now)))
            }
            (Peek::Claimed, ..) => None,
        };
        Peeked::NotDone { claim_ends_in }
    }

    /// `claim`: `Seen` if done, `Held` if another live claim holds it, else the
    /// key is claimed by `token` until `until` (a lapsed claim is taken over).
    pub fn claim(
        &mut self,
        rules: Rules,
        now: Option<u64>,
        token: T,
        until: Option<u64>,
    ) -> ClaimAnswer {
        self.settled(rules, now);
        match self.peek(now) {
            Peek::Done => ClaimAnswer::Seen,
            Peek::Claimed => ClaimAnswer::Held,
            Peek::Free => {
                *self = Record::Claimed { token, until };
                ClaimAnswer::Acquired
            }
        }
    }

    /// `renew`: the owner's claim (live, or lapsed and kept) now lasts until
    /// `until`; `false` when the claim is not `token`'s any more.
    pub fn renew(&mut self, rules: Rules, now: Option<u64>, token: &T, until: Option<u64>) -> bool {
        self.settled(rules, now);
        match self {
            Record::Claimed { token: t, until: u } if t == token => {
                *u = until;
                true
            }
            _ => false,
        }
    }

    /// `release`: the owner's claim goes; anything else is left alone.
    pub fn release(&mut self, rules: Rules, now: Option<u64>, token: &T) {
        self.settled(rules, now);
        let anyones = !rules.claims_have_owners && matches!(self, Record::Claimed { .. });
        if anyones || self.claimed_by(token) {
            *self = Record::Free;
        }
    }

    /// `remember` (plain): done until `until`, whatever the record was (it ends
    /// any claim, as the spec's `remember` does); a live done record keeps its
    /// expiry where the rules say so.
    pub fn remember(&mut self, rules: Rules, now: Option<u64>, until: Option<u64>) {
        self.settled(rules, now);
        if !rules.remember_resets_expiry && self.peek(now) == Peek::Done {
            return;
        }
        *self = Record::Done { until, by: None };
    }

    /// `remember_fenced`: `true` when `token` still owned the claim (or, where
    /// done records keep their token, had already committed it), and the key is
    /// done. `false`: the claim was lost; the key is then remembered only if it
    /// is free, never over another consumer's live claim or a done record.
    pub fn remember_fenced(
        &mut self,
        rules: Rules,
        now: Option<u64>,
        token: &T,
        until: Option<u64>,
    ) -> bool {
        self.settled(rules, now);
        if rules.done_keeps_token
            && matches!(self, Record::Done { by: Some(by), .. } if by == token)
        {
            // The same commit again (its first reply was lost): ours. Only while
            // the record is live: an expired one reads as free, as everywhere.
            self.set_done(rules, token, until);
            return true;
        }
        let ours = self.claimed_by(token);
        if ours {
            self.set_done(rules, token, until);
        } else if self.peek(now) == Peek::Free {
            // Recorded, but not under a claim of this token's.
            *self = Record::Done { until, by: None };
        }
        ours
    }

    fn set_done(&mut self, rules: Rules, token: &T, until: Option<u64>) {
        let by = rules.done_keeps_token.then(|| token.clone());
        *self = Record::Done { until, by };
    }

    /// `forget`: free, whatever it was.
    pub fn forget(&mut self) {
        *self = Record::Free;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REDIS: Rules = Rules {
        lapsed_claim_kept: false,
        done_keeps_token: false,
        claims_have_owners: true,
        remember_resets_expiry: true,
        lapsed_claim_swept: false,
        claim_given_back: false,
    };

    fn t(s: &'static str) -> &'static str {
        s
    }
    use ClaimAnswer::{Acquired, Held};

    #[test]
    fn a_lapsed_claim_is_taken_over_and_its_owner_fenced_off() {
        for rules in [Rules::KEPT, REDIS] {
            let mut r: Record<&str> = Record::Free;
            assert_eq!(r.claim(rules, Some(0), t("a"), Some(10)), Acquired);
            assert_eq!(r.claim(rules, Some(5), t("b"), Some(15)), Held);
            assert_eq!(r.claim(rules, Some(10), t("b"), Some(20)), Acquired);
            assert!(!r.renew(rules, Some(11), &t("a"), Some(30)));
            assert!(!r.remember_fenced(rules, Some(11), &t("a"), None));
            assert!(r.remember_fenced(rules, Some(12), &t("b"), None));
            assert!(r.seen(Some(u64::MAX - 1)));
        }
    }

    #[test]
    fn a_lapsed_claim_nobody_took_is_kept_or_gone_by_the_rules() {
        let mut kept: Record<&str> = Record::Free;
        kept.claim(Rules::KEPT, Some(0), t("a"), Some(10));
        assert!(kept.renew(Rules::KEPT, Some(20), &t("a"), Some(40)));
        let mut gone: Record<&str> = Record::Free;
        gone.claim(REDIS, Some(0), t("a"), Some(10));
        assert!(!gone.renew(REDIS, Some(20), &t("a"), Some(40)));
        // Gone, so the lost commit finds the key free and still records it.
        assert!(!gone.remember_fenced(REDIS, Some(20), &t("a"), None));
        assert!(gone.seen(Some(21)));
    }

    #[test]
    fn a_commit_sent_again_is_ours_only_where_done_keeps_its_token() {
        let mut r: Record<&str> = Record::Free;
        r.claim(Rules::KEPT, Some(0), t("a"), Some(10));
        assert!(r.remember_fenced(Rules::KEPT, Some(1), &t("a"), None));
        assert!(r.remember_fenced(Rules::KEPT, Some(2), &t("a"), None));
        assert!(!r.remember_fenced(Rules::KEPT, Some(2), &t("b"), None));
        let mut r: Record<&str> = Record::Free;
        r.claim(REDIS, Some(0), t("a"), Some(10));
        assert!(r.remember_fenced(REDIS, Some(1), &t("a"), None));
        assert!(!r.remember_fenced(REDIS, Some(2), &t("a"), None));
    }

    /// Found by a user's store (a fresh-eyes review): an expired done record
    /// reads as free for a re-sent commit too, whatever ran in between.
    #[test]
    fn a_commit_sent_again_after_its_record_expired_is_not_ours() {
        for stranger_released in [false, true] {
            let mut r: Record<&str> = Record::Free;
            r.claim(Rules::KEPT, Some(0), t("a"), Some(1000));
            assert!(r.remember_fenced(Rules::KEPT, Some(0), &t("a"), Some(1000)));
            if stranger_released {
                r.release(Rules::KEPT, Some(1000), &t("b"));
            }
            assert!(!r.remember_fenced(Rules::KEPT, Some(1000), &t("a"), None));
            assert!(r.seen(Some(2000)), "recorded anyway: the key was free");
        }
    }

    #[test]
    fn a_lost_commit_never_overwrites_a_live_claim() {
        let mut r: Record<&str> = Record::Free;
        r.claim(Rules::KEPT, Some(0), t("b"), Some(100));
        assert!(!r.remember_fenced(Rules::KEPT, Some(1), &t("a"), None));
        assert_eq!(r.peek(Some(1)), Peek::Claimed);
        r.release(Rules::KEPT, Some(2), &t("a"));
        assert_eq!(r.peek(Some(2)), Peek::Claimed);
        r.release(Rules::KEPT, Some(2), &t("b"));
        assert_eq!(r, Record::Free);
    }

    #[test]
    fn done_expires_into_free() {
        let mut r: Record<&str> = Record::Free;
        r.remember(Rules::KEPT, Some(0), Some(10));
        assert!(r.seen(Some(9)));
        assert!(!r.seen(Some(10)));
        assert_eq!(r.claim(Rules::KEPT, Some(10), t("a"), Some(20)), Acquired);
    }
}
