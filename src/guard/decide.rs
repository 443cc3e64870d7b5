//! Deciding: each body classified, in-batch duplicates collapsed, the store asked
//! once (seen, or claim and re-check) for every distinct key.

use super::*;

impl<S: Store, O: Observer, T: Timer> Guard<S, O, T> {
    /// Classifies one body and, if it has a key, asks the store (single-key calls).
    pub(super) async fn decide_one<'b, B: Body + ?Sized>(
        &self,
        body: &'b B,
    ) -> (Option<Message<'b>>, Decision) {
        let (message, mut decision) = self.classify(body);
        if decision.verdict == Verdict::Run {
            self.ask_store(std::slice::from_mut(&mut decision), &[0])
                .await;
        }
        (message, decision)
    }

    /// Decides a batch with one store call (plus one re-check if, in claiming mode,
    /// some ids are held by another consumer). The host then runs the handler for
    /// each decision whose [`Decision::should_run`] is true.
    pub async fn decide_batch<B: Body>(&self, bodies: &[B]) -> Vec<Decision> {
        self.plan(bodies).await.1
    }

    /// Decodes one body and derives its key; the store is not asked yet.
    pub(super) fn classify<'b, B: Body + ?Sized>(
        &self,
        body: &'b B,
    ) -> (Option<Message<'b>>, Decision) {
        let message = match body.decode(&self.options.limits) {
            Ok(m) => m,
            Err(r) => {
                let mut decision = Decision::unkeyed(Verdict::Reject(r));
                decision.span = self.start_span(body, None);
                return (None, decision);
            }
        };
        let mut decision = match message.id() {
            None => Decision::unkeyed(Verdict::FailOpen),
            Some(id) => {
                let key = self.options.keyspace.key(id).into_owned();
                match self.fingerprint_of(&message, &key) {
                    Ok(fingerprint) => Decision {
                        verdict: Verdict::Run,
                        key: Some(key),
                        claim: None,
                        fingerprint,
                        park_for: None,
                        span: DeliverySpan::default(),
                    },
                    Err(refused) => Decision::unkeyed(Verdict::StoreUnavailable(refused)),
                }
            }
        };
        decision.span = self.start_span(body, Some(&message));
        (Some(message), decision)
    }

    /// The delivery's fingerprint with [`Options::fingerprint`] on; refused (every
    /// keyed delivery fails closed) where fingerprints cannot be kept.
    pub(super) fn fingerprint_of(
        &self,
        message: &Message<'_>,
        key: &str,
    ) -> StoreResult<Option<Fingerprint>> {
        if !self.options.fingerprint {
            return Ok(None);
        }
        if let Some(format) = self.store.shared_format() {
            return Err(StoreError::unsupported(format!(
                "payload fingerprints need our own record format; this store keeps {format} records"
            )));
        }
        #[cfg(feature = "fingerprint")]
        return Ok(Fingerprint::of(message.raw(), key));
        #[cfg(not(feature = "fingerprint"))]
        {
            let _ = (message, key);
            Err(StoreError::unsupported(
                "payload fingerprints: this build leaves out the `fingerprint` feature",
            ))
        }
    }

    /// Classifies every body, collapses in-batch duplicates, and asks the store
    /// about each distinct key once.
    pub(super) async fn plan<'b, B: Body>(
        &self,
        bodies: &'b [B],
    ) -> (Vec<Option<Message<'b>>>, Vec<Decision>) {
        let (messages, mut decisions): (Vec<_>, Vec<_>) =
            bodies.iter().map(|body| self.classify(body)).unzip();
        self.observe_batch(decisions.len());
        let unique = mark_followers(&mut decisions);
        self.ask_store(&mut decisions, &unique).await;
        (messages, decisions)
    }

    /// Settles the `Run` verdicts at `unique` (distinct keys) with the store:
    /// `seen` in plain mode, `claim` in claiming mode.
    pub(super) async fn ask_store(&self, decisions: &mut [Decision], unique: &[usize]) {
        if unique.is_empty() {
            return;
        }
        self.ask_about(decisions, unique).await;
        // A call the store refused for all (not a failure to reach it: a key
        // holding another SDK's value, an answer it could not read) is asked
        // again a key at a time, so that only the key at fault fails: one
        // such key made the batch's every other id store-unavailable for as
        // long as it stayed, and dead-lettered them in the end (a trial).
        let refused = |d: &Decision| matches!(&d.verdict, Verdict::StoreUnavailable(e) if e.kind == crate::store::StoreErrorKind::Internal);
        if unique.len() > 1 && unique.iter().all(|&i| refused(&decisions[i])) {
            for &i in unique {
                decisions[i].verdict = Verdict::Run;
                self.ask_about(decisions, &[i]).await;
            }
        }
        self.check_fingerprints(decisions).await;
    }

    /// `seen` in plain mode, `claim` in claiming mode, for the keys at `unique`.
    async fn ask_about(&self, decisions: &mut [Decision], unique: &[usize]) {
        match self.options.claim_lease {
            Some(lease) => self.claim_all(unique, decisions, lease).await,
            None => self.check_all(unique, decisions).await,
        }
    }

    /// For each skip that has a fingerprint (a leader's: [`mark_followers`]
    /// made every follower a duplicate or a mismatch): one more call (only when
    /// the batch has skips) reads its marker and record. Marker without record:
    /// the id was processed with another payload. A follower whose payload is
    /// not its skipped leader's is read too: it may be the one processed.
    pub(super) async fn check_fingerprints(&self, decisions: &mut [Decision]) {
        let mut skips = Vec::new();
        // Each key's first delivery (its leader), found once a batch has a
        // mismatch: a scan of the batch per mismatch was quadratic (a trial).
        let mut leaders = None;
        for (i, d) in decisions.iter().enumerate() {
            let read = match d.verdict {
                _ if d.fingerprint.is_none() => false,
                Verdict::Skip => true,
                Verdict::PayloadMismatch => d.key.as_deref().is_some_and(|key| {
                    leaders
                        .get_or_insert_with(|| first_of_each_key(decisions))
                        .of(key)
                        .is_some_and(|leader| decisions[leader].verdict == Verdict::Skip)
                }),
                _ => false,
            };
            if read {
                skips.push(i);
            }
        }
        drop(leaders); // it borrows the decisions, which are written below
        if skips.is_empty() {
            return;
        }
        let keys: Vec<&str> = skips
            .iter()
            .filter_map(|&i| decisions[i].fingerprint.as_ref())
            .flat_map(|fp| [fp.marker_key.as_str(), fp.record_key.as_str()])
            .collect();
        let spans = skips.iter().map(|&i| &decisions[i].span);
        let call = self.store.seen_many(&keys);
        let answers = self.store_call("seen_many", keys.len(), spans, call).await;
        let answers = checked_len(answers, keys.len());
        self.report_store_error(StoreOp::Seen, &answers);
        for (n, &i) in skips.iter().enumerate() {
            decisions[i].verdict = match &answers {
                Ok(a) if a[2 * n] && !a[2 * n + 1] => Verdict::PayloadMismatch,
                Ok(_) => Verdict::Skip,
                Err(e) => Verdict::StoreUnavailable(e.clone()),
            };
        }
    }

    /// Plain mode: one `seen_many` for the distinct keys (`seen` for one: the
    /// same call where the store does not override it, and no allocation on a
    /// single delivery's path where it does).
    pub(super) async fn check_all(&self, unique: &[usize], decisions: &mut [Decision]) {
        if let [i] = *unique {
            let call = self.store.seen(key_at(decisions, i));
            let answer = self.store_call("seen", 1, [&decisions[i].span], call).await;
            self.report_store_error(StoreOp::Seen, &answer);
            decisions[i].verdict = after_seen(answer.as_ref().copied());
            return;
        }
        let keys: Vec<&str> = unique.iter().map(|&i| key_at(decisions, i)).collect();
        let spans = unique.iter().map(|&i| &decisions[i].span);
        let answers = self.store_call("seen_many", keys.len(), spans, self.store.seen_many(&keys));
        let answers = checked_len(answers.await, keys.len());
        self.report_store_error(StoreOp::Seen, &answers);
        for (n, &i) in unique.iter().enumerate() {
            decisions[i].verdict = after_seen(answers.as_ref().map(|a| a[n]));
        }
    }

    /// Claiming mode: claim every distinct key (one call); a key held by another
    /// consumer is re-checked with `peek_many` (one more call), then skipped or parked.
    pub(super) async fn claim_all(
        &self,
        unique: &[usize],
        decisions: &mut [Decision],
        lease: Duration,
    ) {
        let keys: Vec<&str> = unique.iter().map(|&i| key_at(decisions, i)).collect();
        let spans = unique.iter().map(|&i| &decisions[i].span);
        let call = self.store.claim_many(&keys, lease);
        let claims = checked_len(
            self.store_call("claim_many", keys.len(), spans, call).await,
            keys.len(),
        );
        self.report_store_error(StoreOp::Claim, &claims);
        let claims = match claims {
            Ok(claims) => claims,
            Err(e) => {
                for &i in unique {
                    decisions[i].verdict = Verdict::StoreUnavailable(e.clone());
                }
                return;
            }
        };
        let mut held = Vec::new();
        for (&i, claim) in unique.iter().zip(claims) {
            match claim {
                Claim::Acquired(token) => decisions[i].claim = Some(token),
                Claim::Seen => decisions[i].verdict = Verdict::Skip,
                Claim::Held => held.push(i),
            }
        }
        if held.is_empty() {
            return;
        }
        // The holder may have finished since: skip if so, otherwise park for as
        // long as its claim has left (where the store can tell).
        let keys: Vec<&str> = held.iter().map(|&i| key_at(decisions, i)).collect();
        let spans = held.iter().map(|&i| &decisions[i].span);
        let call = self.store.peek_many(&keys);
        let peeked = checked_len(
            self.store_call("peek_many", keys.len(), spans, call).await,
            keys.len(),
        );
        self.report_store_error(StoreOp::Seen, &peeked);
        for (n, &i) in held.iter().enumerate() {
            match &peeked {
                Ok(states) => match states[n] {
                    Peeked::Done => decisions[i].verdict = Verdict::Skip,
                    Peeked::NotDone { claim_ends_in } => {
                        decisions[i].verdict = Verdict::Park;
                        decisions[i].park_for = claim_ends_in;
                    }
                },
                Err(e) => decisions[i].verdict = Verdict::StoreUnavailable(e.clone()),
            }
        }
    }
}

/// The in-batch rule, for every mode: the first delivery of each key leads;
/// a later one follows it ([`Verdict::Duplicate`]), or with another payload is
/// a [`Verdict::PayloadMismatch`] (which waits, at the resolve, where the
/// leader's payload is not recorded). Answers the leaders' indices, in order.
pub(super) fn mark_followers(decisions: &mut [Decision]) -> Vec<usize> {
    let mut unique: Vec<usize> = Vec::new();
    let mut followers: Vec<(usize, usize)> = Vec::new();
    // The map borrows the keys, so followers are marked after it is dropped.
    {
        let mut leaders: hashbrown::HashMap<&str, usize, RandomState> =
            hashbrown::HashMap::with_capacity_and_hasher(decisions.len(), RandomState::default());
        for (i, decision) in decisions.iter().enumerate() {
            if let Some(key) = decision.key.as_deref() {
                match leaders.entry(key) {
                    hashbrown::hash_map::Entry::Occupied(leader) => {
                        followers.push((i, *leader.get()))
                    }
                    hashbrown::hash_map::Entry::Vacant(slot) => {
                        slot.insert(i);
                        unique.push(i);
                    }
                }
            }
        }
    }
    for (i, leader) in followers {
        decisions[i].verdict = if same_payload(&decisions[i], &decisions[leader]) {
            Verdict::Duplicate(leader)
        } else {
            // One id, two payloads in one batch: the first one runs.
            Verdict::PayloadMismatch
        };
    }
    unique
}

/// The first delivery of each key in a batch: the one that leads it.
pub(super) fn first_of_each_key(decisions: &[Decision]) -> Leaders<'_> {
    let mut first =
        hashbrown::HashMap::with_capacity_and_hasher(decisions.len(), RandomState::default());
    for (i, decision) in decisions.iter().enumerate() {
        if let Some(key) = decision.key.as_deref() {
            if let hashbrown::hash_map::Entry::Vacant(slot) = first.entry(key) {
                slot.insert(i);
            }
        }
    }
    Leaders(first)
}

/// Each key's first delivery ([`first_of_each_key`]).
pub(super) struct Leaders<'d>(hashbrown::HashMap<&'d str, usize, RandomState>);

impl<'d> Leaders<'d> {
    /// The leader of `key`'s deliveries. (Through `entry`, as the map is
    /// filled: one copy of the map's code in the wasm modules, not two.)
    pub(super) fn of(&mut self, key: &'d str) -> Option<usize> {
        match self.0.entry(key) {
            hashbrown::hash_map::Entry::Occupied(leader) => Some(*leader.get()),
            hashbrown::hash_map::Entry::Vacant(_) => None,
        }
    }
}

/// Do two deliveries of one key carry the same payload (as far as fingerprints
/// are kept)?
pub(super) fn same_payload(a: &Decision, b: &Decision) -> bool {
    match (&a.fingerprint, &b.fingerprint) {
        (Some(a), Some(b)) => a.hash == b.hash,
        _ => true,
    }
}

/// The verdict once the store has said whether the key was seen.
pub(super) fn after_seen(answer: Result<bool, &StoreError>) -> Verdict {
    match answer {
        Ok(true) => Verdict::Skip,
        Ok(false) => Verdict::Run,
        Err(e) => Verdict::StoreUnavailable(e.clone()),
    }
}
