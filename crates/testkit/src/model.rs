//! The model each answer is checked against: one key's part of a call
//! (`KeyOp`), one key's part of a reply (`KeyAnswer`), what the record model
//! ([`bq_dedupe::store::record`]) answers to it (`apply`), and the records a key
//! may be in after a call answered as it did, the call taking effect anywhere
//! in its time window (`next_records`). The runner and the history checker both
//! judge by it.

use std::time::Duration;

use bq_dedupe::store::record::{ClaimAnswer, Peek, Record, Rules};
use bq_dedupe::store::{Claim, ClaimToken, Peeked, TxRun};

/// What one key's part of a call does.
#[derive(Debug, Clone)]
pub(crate) enum KeyOp {
    Seen,
    Peek,
    Remember(Option<u64>),
    Forget,
    Claim(u64),
    Renew(ClaimToken, u64),
    Release(ClaimToken),
    Commit(ClaimToken, Option<u64>),
    /// A transaction: the run's own claim (where it took one), TTL, whether
    /// its work succeeds.
    Transact(Option<ClaimToken>, Option<u64>, bool),
}

/// One key's part of a reply.
#[derive(Debug, Clone)]
pub(crate) enum KeyAnswer {
    Done,
    Bool(bool),
    /// The answer, and the token of an acquired claim (not compared).
    Claim(ClaimAnswer, Option<ClaimToken>),
    /// A peek; a store's "cannot tell how long" (`None`) matches any claim.
    Peek(Peeked),
    /// What a transaction did.
    Tx(TxRun<(), ()>),
}

impl PartialEq for KeyAnswer {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (KeyAnswer::Done, KeyAnswer::Done) => true,
            (KeyAnswer::Bool(a), KeyAnswer::Bool(b)) => a == b,
            (KeyAnswer::Claim(a, _), KeyAnswer::Claim(b, _)) => a == b,
            // A work that swallowed its error and found its transaction
            // aborted commits nothing, as a failed one: the model's rollback.
            (KeyAnswer::Tx(TxRun::Aborted(_)), KeyAnswer::Tx(TxRun::RolledBack(())))
            | (KeyAnswer::Tx(TxRun::RolledBack(())), KeyAnswer::Tx(TxRun::Aborted(_))) => true,
            (KeyAnswer::Tx(a), KeyAnswer::Tx(b)) => a == b,
            (KeyAnswer::Peek(a), KeyAnswer::Peek(b)) => match (a, b) {
                (Peeked::NotDone { claim_ends_in: x }, Peeked::NotDone { claim_ends_in: y }) => {
                    x.is_none() || y.is_none() || x == y
                }
                (a, b) => a == b,
            },
            _ => false,
        }
    }
}

impl From<Claim> for KeyAnswer {
    fn from(claim: Claim) -> Self {
        match claim {
            Claim::Acquired(token) => KeyAnswer::Claim(ClaimAnswer::Acquired, Some(token)),
            Claim::Seen => KeyAnswer::Claim(ClaimAnswer::Seen, None),
            Claim::Held => KeyAnswer::Claim(ClaimAnswer::Held, None),
        }
    }
}

/// The records a key may be in after one key's part of a call answered `got`,
/// from any of `records`, the call taking effect at some instant of `(lo, hi)`
/// (tried at both ends). `Err` when the model allows that answer from none.
pub(crate) fn next_records(
    records: &[Record],
    rules: Rules,
    part: &KeyOp,
    got: &KeyAnswer,
    (lo, hi): (u64, u64),
) -> Result<Vec<Record>, String> {
    let mut records = records.to_vec();
    if rules.lapsed_claim_swept {
        sweep_may_have_run(&mut records, hi);
    }
    let token = match got {
        KeyAnswer::Claim(_, token) => token.clone(),
        _ => None,
    };
    // Every record the key may be in, at either end of the call's time,
    // that gives the store's answer.
    let mut next: Vec<Record> = Vec::new();
    let mut expected = Vec::new();
    // Per record, a peek's time left at the window's two ends.
    let mut windows: Vec<(&Record, Duration, Duration)> = Vec::new();
    for record in &records {
        let mut ends = Vec::new();
        for now in [lo, hi] {
            let mut r = record.clone();
            let answer = apply(&mut r, rules, now, part, token.clone());
            if let KeyAnswer::Peek(Peeked::NotDone {
                claim_ends_in: Some(left),
            }) = &answer
            {
                ends.push(*left);
            }
            let given_back = rules.claim_given_back
                && held_by_a_claim_given_back(part, got)
                && record.peek(Some(now)) == Peek::Free;
            if answer == *got && !next.contains(&r) {
                next.push(r);
            }
            if given_back && !next.contains(record) {
                // Another consumer's claim, given back since: nothing changed.
                next.push(record.clone());
            }
            if answer != *got && !given_back {
                expected.push((answer, now));
            }
        }
        if let [early, late] = ends[..] {
            windows.push((record, late, early));
        }
    }
    // A claim's time left, read at some instant inside the window, of a
    // claim taken at some instant inside its own: anything between what
    // the model says at the ends, over the records of that one claim
    // (the same token, its end known only within a window).
    // (Not only when nothing matched exactly: an exact match at one end
    // must not drop the records of the same claim with other ends.)
    if let KeyAnswer::Peek(Peeked::NotDone {
        claim_ends_in: Some(left),
    }) = got
    {
        for (record, ..) in &windows {
            let Record::Claimed { token: ours, .. } = record else {
                continue;
            };
            let same: Vec<_> = windows
                .iter()
                .filter(|w| matches!(w.0, Record::Claimed { token, .. } if token == ours))
                .collect();
            let least = same.iter().map(|w| w.1).min();
            let most = same.iter().map(|w| w.2).max();
            if let (Some(least), Some(most)) = (least, most)
                && (least..=most).contains(left)
                && !next.contains(record)
            {
                next.push((*record).clone());
            }
        }
    }
    if next.is_empty() {
        return Err(format!(
            "the store answered {got:?}, the model {expected:?} (answer, at ms); the \
             record was one of {records:?}"
        ));
    }
    Ok(next)
}

/// A store that sweeps lapsed claims (`Rules::lapsed_claim_swept`) may have
/// removed any claim that lapsed by `now`: its record may also be free.
fn sweep_may_have_run(records: &mut Vec<Record>, now: u64) {
    let lapsed = records
        .iter()
        .any(|r| matches!(r, Record::Claimed { until: Some(until), .. } if *until <= now));
    if lapsed && !records.contains(&Record::Free) {
        records.push(Record::Free);
    }
}

/// One key's part under the model at `now`.
pub(crate) fn apply(
    r: &mut Record,
    rules: Rules,
    now: u64,
    part: &KeyOp,
    token: Option<ClaimToken>,
) -> KeyAnswer {
    let now_ = Some(now);
    let after = |ms: u64| Some(now.saturating_add(ms));
    match part {
        KeyOp::Seen => KeyAnswer::Bool(r.seen(now_)),
        KeyOp::Peek => KeyAnswer::Peek(r.peeked(now_)),
        KeyOp::Remember(ttl) => {
            r.remember(rules, now_, ttl.and_then(after));
            KeyAnswer::Done
        }
        KeyOp::Forget => {
            r.forget();
            KeyAnswer::Done
        }
        KeyOp::Claim(lease) => {
            // The store's token, when it granted the claim (a refusal writes none).
            let token = token.unwrap_or_else(|| ClaimToken("(not granted)".into()));
            KeyAnswer::Claim(r.claim(rules, now_, token, after(*lease)), None)
        }
        KeyOp::Renew(token, lease) => KeyAnswer::Bool(r.renew(rules, now_, token, after(*lease))),
        KeyOp::Release(token) => {
            r.release(rules, now_, token);
            KeyAnswer::Done
        }
        KeyOp::Commit(token, ttl) => {
            KeyAnswer::Bool(r.remember_fenced(rules, now_, token, ttl.and_then(after)))
        }
        // Done: nothing runs; another's live claim: nothing runs; else (free, or
        // the run's own claim, which the commit clears) the work's writes and
        // the key commit together, or neither (a claim is then left as it was).
        KeyOp::Transact(claim, ttl, ok) => {
            let ours = claim.as_ref().is_some_and(|token| r.claimed_by(token));
            KeyAnswer::Tx(match r.peek(now_) {
                Peek::Done => TxRun::AlreadyDone,
                Peek::Claimed if !ours => TxRun::Held,
                _ if *ok => {
                    r.remember(rules, now_, ttl.and_then(after));
                    TxRun::Committed(())
                }
                _ => TxRun::RolledBack(()),
            })
        }
    }
}

/// The answers a free key may get under [`Rules::claim_given_back`]: held by a
/// claim that another consumer took and then gave back. A fenced commit whose
/// claim was lost records the key only where no live claim holds it, so such
/// a claim also leaves it unrecorded (answering `false`; the guard reports the
/// run `run-ok-lease-lost`). Found at 8 clients, seed 6636306954578654565.
fn held_by_a_claim_given_back(part: &KeyOp, got: &KeyAnswer) -> bool {
    matches!(
        got,
        KeyAnswer::Claim(ClaimAnswer::Held, _)
            | KeyAnswer::Tx(TxRun::Held)
            | KeyAnswer::Peek(Peeked::NotDone {
                claim_ends_in: Some(_) | None
            })
    ) || matches!((part, got), (KeyOp::Commit(..), KeyAnswer::Bool(false)))
}
