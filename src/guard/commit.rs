//! Committing: what each delivery's result writes (remember, fenced in claiming
//! mode, or give back its claim), in one store step, and its outcome.

use super::*;

impl<S: Store, O: Observer, T: Timer> Guard<S, O, T> {
    /// Completes one decision with its handler's result (`None`: it did not
    /// run); `claims_end` where its claim could not be renewed.
    pub(super) async fn complete<E>(
        &self,
        decision: Decision,
        result: Option<HandlerResult<E>>,
        claims_end: Option<u64>,
    ) -> Outcome<E> {
        let recorded = match commit_of(&decision, &result) {
            Commit::Remember => {
                // A plain remember of one key is the store's own `remember` call;
                // without fingerprints its one entry needs no list of its own.
                let one;
                let listed;
                let remember: &[_] = match decision.fingerprint {
                    None => {
                        one = [self.remember_entry(&decision)];
                        &one
                    }
                    Some(_) => {
                        listed = self.remember_list(std::slice::from_ref(&decision), &[0]);
                        &listed
                    }
                };
                let step = Settlement {
                    remember,
                    ttl: self.options.ttl,
                    ..Settlement::default()
                };
                let written = self.apply_step(&step, [&decision.span]).await;
                let in_time = self.written_in_time(claims_end);
                written.map(|s| in_time(&decision, s.kept.last().copied().unwrap_or(false)))
            }
            Commit::Release(key, token) => {
                let in_lease = !self.ran_out(claims_end);
                let claimed = Some((key, token)).filter(|_| in_lease);
                self.give_back(claimed, &decision.span).await;
                Ok(true)
            }
            Commit::Nothing => Ok(true),
        };
        let outcome = outcome_of(&decision.verdict, result, &recorded);
        self.observe_outcome(&decision, &outcome);
        outcome
    }

    /// Records a batch with one store call: remembers the keys whose handler
    /// succeeded (fenced in claiming mode), releases the claims of those that
    /// failed, and resolves every delivery's outcome. `results[i]` is the handler
    /// result for `decisions[i]` (`None` where it did not run).
    pub async fn complete_batch<E>(
        &self,
        decisions: Vec<Decision>,
        results: Vec<Option<HandlerResult<E>>>,
    ) -> Vec<Outcome<E>> {
        let mut progress = Progress::new(decisions.len(), None);
        for (i, result) in results.into_iter().enumerate().take(decisions.len()) {
            if matches!(result, Some(HandlerResult::Ok)) && decisions[i].verdict == Verdict::Run {
                progress.waiting.push(i);
            }
            progress.results[i] = result;
        }
        self.finish(&decisions, progress).await
    }

    /// The commit: writes what is still waiting and releases what did not
    /// succeed (one call), then resolves every outcome.
    pub(super) async fn finish<E>(
        &self,
        decisions: &[Decision],
        progress: Progress<E>,
    ) -> Vec<Outcome<E>> {
        let Progress {
            results,
            mut written,
            lost,
            waiting,
            claims_end,
            ..
        } = progress;
        let remember = self.remember_list(decisions, &waiting);
        // A claim run out (by our clock, where the store cannot renew) may be
        // another consumer's now, and a store that cannot tell claimers apart
        // (PHP's format) would release theirs: left to its lease (a review).
        let lapsed = self.ran_out(claims_end);
        let (released, release): (Vec<usize>, Vec<(&str, &ClaimToken)>) = decisions
            .iter()
            .zip(&results)
            .zip(&lost)
            .enumerate()
            .filter(|(_, (_, lost))| !**lost && !lapsed)
            .filter_map(
                |(i, ((decision, result), _))| match commit_of(decision, result) {
                    Commit::Release(key, token) => Some((i, (key, token))),
                    _ => None,
                },
            )
            .unzip();
        // The deliveries the call carries (its span links them).
        let carried = waiting.iter().chain(&released).map(|&i| &decisions[i].span);
        let step = Settlement {
            remember: &remember,
            ttl: self.options.ttl,
            release: &release,
            ..Settlement::default()
        };
        let committed = match (remember.is_empty(), release.is_empty()) {
            (true, true) => Ok(Settled::default()),
            _ => self.apply_step(&step, carried).await,
        };
        let mut commit_error = None;
        match committed {
            Ok(settled) => {
                let in_time = self.written_in_time(claims_end);
                for (&i, kept) in waiting.iter().zip(ids_kept(&settled, waiting.len())) {
                    written[i] = Some(in_time(&decisions[i], *kept));
                }
            }
            Err(e) if !remember.is_empty() => commit_error = Some(e),
            Err(_) => {} // Releases only: the leases run out by themselves.
        }

        let mut results = results;
        self.resolve(decisions, |i| {
            let recorded = match (written[i], &commit_error) {
                (Some(kept), _) => Ok(kept),
                (None, Some(e)) => Err(e.clone()),
                (None, None) => Ok(true),
            };
            outcome_of(&decisions[i].verdict, results[i].take(), &recorded)
        })
    }

    /// Every delivery's outcome in order, each observed: an in-batch duplicate
    /// follows its leader's ([`follow`]), the others' come from `own`. Every
    /// mode resolves a batch through here.
    pub(super) fn resolve<E>(
        &self,
        decisions: &[Decision],
        mut own: impl FnMut(usize) -> Outcome<E>,
    ) -> Vec<Outcome<E>> {
        let mut outcomes: Vec<Outcome<E>> = Vec::with_capacity(decisions.len());
        // Each key's first delivery, found once a batch has a mismatch (a scan
        // per mismatch was quadratic, a trial).
        let mut leaders = None;
        for (i, decision) in decisions.iter().enumerate() {
            let follows = match decision.verdict {
                Verdict::Duplicate(of) => Some(of),
                // Another payload than an earlier delivery of its key: a
                // mismatch once that one's is recorded (or found done, or found
                // a mismatch); while nothing is, it waits as a copy would.
                Verdict::PayloadMismatch => decision
                    .key
                    .as_deref()
                    .and_then(|key| {
                        leaders
                            .get_or_insert_with(|| decide::first_of_each_key(decisions))
                            .of(key)
                    })
                    .filter(|&of| of < i)
                    .filter(|&of| outcomes.get(of).is_some_and(|l| !settles_its_id(l.kind()))),
                _ => None,
            };
            let outcome = match follows {
                Some(of) => follow(outcomes.get(of)),
                None => own(i),
            };
            self.observe_outcome(decision, &outcome);
            outcomes.push(outcome);
        }
        outcomes
    }

    /// A claim given back after a run that wrote nothing, so that its retry
    /// runs without waiting out the lease (a failed release only observed: it
    /// changes no outcome, the lease runs out by itself).
    pub(super) async fn give_back(
        &self,
        claimed: Option<(&str, &ClaimToken)>,
        span: &DeliverySpan,
    ) {
        if let Some(claimed) = claimed {
            let release = [claimed];
            let step = Settlement {
                release: &release,
                ..Settlement::default()
            };
            let _ = self.apply_step(&step, [span]).await;
        }
    }

    /// One batch step in as few calls as the store allows; store errors are
    /// reported to the observer (a failed release only there: it changes no
    /// outcome, the lease runs out by itself).
    pub(super) async fn apply_step<'s>(
        &self,
        step: &Settlement<'_>,
        spans: impl IntoIterator<Item = &'s DeliverySpan>,
    ) -> StoreResult<Settled> {
        let keys = step.remember.len() + step.release.len() + step.renew.len();
        let result = match keys {
            0 => Ok(Settled::default()),
            _ => {
                let settled = self.store_call("settle", keys, spans, self.store.settle(step));
                settled
                    .await
                    .and_then(|settled| answered_in_full(settled, step))
            }
        };
        let op = if step.remember.is_empty() {
            StoreOp::Renew
        } else {
            StoreOp::Remember
        };
        match &result {
            Ok(settled) => {
                if let Some(error) = &settled.release_error {
                    self.observer.observe(Event::StoreError {
                        op: StoreOp::Release,
                        error,
                    });
                }
            }
            Err(error) if step.remember.is_empty() && step.renew.is_empty() => {
                self.observer.observe(Event::StoreError {
                    op: StoreOp::Release,
                    error,
                });
            }
            Err(error) => self.observer.observe(Event::StoreError { op, error }),
        }
        result
    }

    /// What remembering the successes at `waiting` writes: their keys (fenced in
    /// claiming mode), in order, then their fingerprint records (plain). The
    /// store's `kept` answers line up with `waiting` for that reason.
    /// What remembering the successes `waiting` writes, in this order: each
    /// one's fingerprint companions (its record, then its marker), then the
    /// ids, whose answers are the last ([`ids_kept`]). A write that breaks
    /// part-way (a Redis pipeline) so never leaves an id recorded without its
    /// fingerprint, nor a marker without its record, which read as another
    /// payload: a redelivery was dead-lettered as a mismatch (a review).
    pub(super) fn remember_list<'d>(
        &self,
        decisions: &'d [Decision],
        waiting: &[usize],
    ) -> Vec<(&'d str, Option<&'d ClaimToken>)> {
        let mut remember: Vec<(&str, Option<&ClaimToken>)> = Vec::new();
        for &i in waiting {
            if let Some(fp) = &decisions[i].fingerprint {
                remember.push((fp.record_key.as_str(), None));
                remember.push((fp.marker_key.as_str(), None));
            }
        }
        remember.extend(waiting.iter().map(|&i| self.remember_entry(&decisions[i])));
        remember
    }

    /// What remembering one success writes first: its key, fenced by its claim
    /// where the store fences.
    pub(super) fn remember_entry<'d>(
        &self,
        decision: &'d Decision,
    ) -> (&'d str, Option<&'d ClaimToken>) {
        (
            decision.key.as_deref().unwrap_or_default(),
            self.fence_token(decision),
        )
    }

    /// The token a success is committed under: its claim, when the store fences.
    pub(super) fn fence_token<'d>(&self, decision: &'d Decision) -> Option<&'d ClaimToken> {
        decision
            .claim
            .as_ref()
            .filter(|_| self.store.fences_commits())
    }
}

/// What recording one delivery takes.
pub(super) enum Commit<'d> {
    Remember,
    Release(&'d str, &'d ClaimToken),
    Nothing,
}

/// The rule: a run that succeeded is remembered; a run that failed, panicked or
/// never happened gives back its claim (if it took one); nothing else touches the
/// store.
pub(super) fn commit_of<'d, E>(
    decision: &'d Decision,
    result: &Option<HandlerResult<E>>,
) -> Commit<'d> {
    match (
        &decision.verdict,
        decision.key.as_deref(),
        result,
        &decision.claim,
    ) {
        (Verdict::Run, Some(_), Some(HandlerResult::Ok), _) => Commit::Remember,
        (Verdict::Run, Some(key), _, Some(token)) => Commit::Release(key, token),
        _ => Commit::Nothing,
    }
}

/// A delivery's outcome from its verdict, its handler's result (`None`: it did
/// not run) and whether its success was recorded (`Ok(false)`: its claim was
/// lost first; recorded where the key was free). The one outcome rule of every
/// mode.
pub(super) fn outcome_of<E>(
    verdict: &Verdict,
    result: Option<HandlerResult<E>>,
    recorded: &StoreResult<bool>,
) -> Outcome<E> {
    match (verdict, result) {
        (Verdict::Run, Some(HandlerResult::Ok)) => match recorded {
            Ok(true) => Outcome::Ran,
            Ok(false) => Outcome::RanLeaseLost,
            Err(e) => Outcome::RanUnrecorded(e.clone()),
        },
        (Verdict::FailOpen, Some(HandlerResult::Ok)) => Outcome::FailOpen(Ok(())),
        (Verdict::FailOpen, Some(HandlerResult::Err(e))) => Outcome::FailOpen(Err(e)),
        (Verdict::Run, Some(HandlerResult::Err(e))) => Outcome::Failed(e),
        (Verdict::Run | Verdict::FailOpen, Some(HandlerResult::Panicked(msg))) => {
            Outcome::Panicked(msg)
        }
        // Told to run but it did not: nothing happened, so redeliver.
        (Verdict::Run | Verdict::FailOpen, None) => Outcome::Parked,
        (Verdict::Skip, _) => Outcome::Skipped,
        (Verdict::Park, _) => Outcome::Parked,
        (Verdict::Reject(r), _) => Outcome::Rejected(r.clone()),
        (Verdict::PayloadMismatch, _) => Outcome::PayloadMismatch,
        (Verdict::StoreUnavailable(e), _) => Outcome::StoreUnavailable(e.clone()),
        // Followers are resolved against their leader ([`Guard::resolve`]).
        (Verdict::Duplicate(_), _) => follow(None),
    }
}

/// A duplicate inside a batch follows the delivery it duplicates: done there means
/// skip here, a payload mismatch there one here; anything else means retry
/// here, without running.
pub(super) fn follow<E>(leader: Option<&Outcome<E>>) -> Outcome<E> {
    match leader.map(Outcome::kind) {
        Some(
            OutcomeKind::Ran
            | OutcomeKind::RanUnrecorded
            | OutcomeKind::RanLeaseLost
            | OutcomeKind::Skipped,
        ) => Outcome::Skipped,
        Some(OutcomeKind::PayloadMismatch) => Outcome::PayloadMismatch,
        Some(OutcomeKind::StoreUnavailable) => match leader {
            Some(Outcome::StoreUnavailable(e)) => Outcome::StoreUnavailable(e.clone()),
            _ => Outcome::Parked,
        },
        _ => Outcome::Parked,
    }
}

/// Whether a leader with this outcome left its id judged (recorded, found
/// done, or found a mismatch), so that another payload behind it is judged too.
fn settles_its_id(kind: OutcomeKind) -> bool {
    matches!(
        kind,
        OutcomeKind::Ran
            | OutcomeKind::RanUnrecorded
            | OutcomeKind::RanLeaseLost
            | OutcomeKind::Skipped
            | OutcomeKind::PayloadMismatch
    )
}

/// The spans of the deliveries that ran with a key: those a commit writes for.
pub(super) fn ran(decisions: &[Decision]) -> impl Iterator<Item = &DeliverySpan> {
    decisions
        .iter()
        .filter(|d| d.should_run() && d.key.is_some())
        .map(|d| &d.span)
}

/// The answers for the `ids` ids of a [`Guard::remember_list`]: its last.
pub(super) fn ids_kept(settled: &Settled, ids: usize) -> &[bool] {
    &settled.kept[settled.kept.len().saturating_sub(ids)..]
}

/// A settle answered with one answer per `remember` and per `renew` entry, or
/// an error: a store (a foreign one, a WIT host) that answers fewer is broken,
/// and an entry left without an answer was read as recorded (a review: `run-ok`
/// for an id never written, run again on its redelivery, unreported).
fn answered_in_full(settled: Settled, step: &Settlement<'_>) -> StoreResult<Settled> {
    let answers = (settled.kept.len(), settled.renewed.len());
    if answers == (step.remember.len(), step.renew.len()) {
        return Ok(settled);
    }
    Err(StoreError::internal(
        "store answered a settle for more or fewer ids than it was given",
    ))
}
