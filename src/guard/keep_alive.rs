//! Keeping a slow batch's claims alive: checkpoints between handlers and on the
//! timer's ticks, and what a failed renewal means.

use super::*;

impl<S: Store, O: Observer, T: Timer> Guard<S, O, T> {
    /// Runs delivery `i`'s handler; with a timer, checkpoints on its ticks until
    /// the handler is done. A checkpoint that has started is finished before the
    /// result is returned, so a store write is never cut off halfway.
    pub(super) async fn run_kept_alive<E>(
        &self,
        handler: &mut impl AsyncFnMut(&Message<'_>) -> Result<(), E>,
        msg: &Message<'_>,
        decisions: &[Decision],
        progress: &mut Progress<E>,
        i: usize,
    ) -> HandlerResult<E> {
        let lease = self.renewing();
        let mut run = pin!(run_caught(handler, msg, &decisions[i].span));
        if !self.timer.available() || (lease.is_none() && progress.waiting.is_empty()) {
            return run.await;
        }
        let every = Progress::<E>::tick(&self.options.leases, lease);
        loop {
            let started = std::cell::Cell::new(false);
            let mut tick = pin!(async {
                self.timer.sleep(every).await;
                started.set(true);
                if progress.due(&self.options.leases, lease, || self.now()) {
                    self.checkpoint(decisions, progress, i, true).await;
                }
            });
            let mut result = None;
            let ticked = std::future::poll_fn(|cx| {
                if result.is_none() {
                    if let Poll::Ready(r) = run.as_mut().poll(cx) {
                        result = Some(r);
                    }
                }
                match (result.is_some(), started.get()) {
                    // Done before the tick: nothing of the tick has happened.
                    (true, false) => Poll::Ready(false),
                    _ => tick.as_mut().poll(cx).map(|()| true),
                }
            })
            .await;
            if let Some(r) = result {
                return r;
            }
            debug_assert!(ticked);
        }
    }

    /// One store call: remembers the waiting successes (fenced in claiming mode)
    /// and renews every claim from `from` on that is still to run (or, when
    /// `running`, is running: delivery `from`).
    pub(super) async fn checkpoint<E>(
        &self,
        decisions: &[Decision],
        progress: &mut Progress<E>,
        from: usize,
        running: bool,
    ) {
        let lease = self.renewing();
        let remember = self.remember_list(decisions, &progress.waiting);
        let renew: Vec<(usize, (&str, &ClaimToken))> = match lease {
            None => Vec::new(),
            Some(_) => (from..decisions.len())
                .filter(|&j| decisions[j].should_run() && !progress.lost[j])
                .filter_map(|j| Some((j, (key_at(decisions, j), decisions[j].claim.as_ref()?))))
                .collect(),
        };
        if remember.is_empty() && renew.is_empty() {
            progress.renewed_at = self.now();
            return;
        }
        let renew_keys: Vec<(&str, &ClaimToken)> = renew.iter().map(|(_, c)| *c).collect();
        let step = Settlement {
            remember: &remember,
            ttl: self.options.ttl,
            release: &[],
            renew: &renew_keys,
            lease: lease.unwrap_or_default(),
        };
        // `answered`: the store said so (not a failed call read as every
        // claim gone once our own clock says a whole lease has passed).
        // Renewed claims run from when the call was sent, not its answer.
        let sent_at = self.now();
        let (renewed, answered) = match self.apply_step(&step, commit::ran(decisions)).await {
            Ok(settled) => {
                let in_time = self.written_in_time(progress.claims_end);
                let kept = commit::ids_kept(&settled, progress.waiting.len());
                for (&i, kept) in progress.waiting.iter().zip(kept) {
                    progress.written[i] = Some(in_time(&decisions[i], *kept));
                }
                progress.waiting.clear();
                progress.waiting_since = None;
                progress.renewed_at = sent_at;
                (settled.renewed, true)
            }
            // Unknown: the successes stay waiting and are written at the commit.
            // But once our own clock says a whole lease has passed since the
            // claims were last confirmed, they may have been taken over: they are
            // lost, and nothing more of the batch runs.
            Err(_) if progress.lease_passed(lease, self.now()) => (vec![false; renew.len()], false),
            Err(_) => return,
        };
        for ((j, _), renewed) in renew.iter().zip(renewed) {
            match (renewed, running && *j == from) {
                (true, _) => {}
                // One yet to run: parked.
                (false, false) => progress.lost[*j] = true,
                // The running one: settled by its fenced commit. Said gone by
                // the store, it is not renewed again; after a failed call it
                // is (a lapsed claim nobody took is still ours).
                (false, true) => {
                    progress.lost[*j] |= answered;
                    self.observe_lease_lost_early(&decisions[*j]);
                }
            }
        }
    }

    /// A renewal found the running handler's claim gone; its commit will say so.
    pub(super) fn observe_lease_lost_early(&self, decision: &Decision) {
        self.observer.observe(Event::LeaseLost {
            key: decision.key.as_deref(),
        });
    }
}
