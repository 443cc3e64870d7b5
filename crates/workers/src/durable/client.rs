//! `DurableObjectStore`: the core's `Store` over sharded `DedupeShard` objects.

use std::time::Duration;

use bq_dedupe::store::wire::Step;
use bq_dedupe::store::{Peeked, Settled, Settlement};
use bq_dedupe::{
    Store, StoreError, StoreResult, store::Capabilities, store::Claim, store::ClaimToken,
    store::StoreErrorKind,
};
use futures_util::future::{join_all, try_join_all};
use wasm_bindgen::JsValue;
use worker::{Method, ObjectNamespace, Request, RequestInit};

use super::protocol::{ClaimRef, Entry, Remember, ShardReply, ShardRequest, wire_ms};
use crate::round_trips::RoundTrips;
use crate::shard::{Layout, key_hash, placement_hash};

/// The seen-set in `shards` Durable Objects of `namespace` (the `DedupeShard`
/// class), spread by jump consistent hashing (see [`Layout`]). Every batch call
/// makes one request per shard it touches, concurrently.
///
/// While resharding, [`DurableObjectStore::with_previous`] names the layout before
/// the change: an id the new layout does not know is looked up there too (only
/// ids whose object differs between the two layouts), so ids remembered or
/// claimed before the change still count. Everything is written to the new
/// layout, and a moved id's claims and remembers to the previous one too.
#[derive(Debug)]
pub struct DurableObjectStore {
    namespace: ObjectNamespace,
    layout: Layout,
    previous: Option<Layout>,
    /// The dedupe window a reshard must outlast (`None`: forever).
    window: Option<Duration>,
    round_trips: RoundTrips,
}

/// A consumer's (layout, previous layout, dedupe window).
type Layouts = (Layout, Option<Layout>, Option<Duration>);

thread_local! {
    /// The layouts this isolate's registry check accepted: asked once per
    /// isolate, not per batch.
    static LAYOUT_ACCEPTED: std::cell::RefCell<Option<Layouts>> =
        const { std::cell::RefCell::new(None) };
}

/// Which object a request goes to, and which of the call's keys it carries.
struct Group {
    object: String,
    members: Vec<usize>,
}

impl DurableObjectStore {
    /// `shards` >= 1, spread by jump consistent hashing: growing it later moves
    /// only the ids that must move (see [`DurableObjectStore::with_previous`]).
    pub fn new(namespace: ObjectNamespace, shards: u32) -> Self {
        DurableObjectStore {
            namespace,
            layout: Layout::Jump(shards.max(1)),
            previous: None,
            window: None,
            round_trips: RoundTrips::new(),
        }
    }

    /// Resharding: `previous` is the layout before the change (see the type's docs).
    pub fn with_previous(mut self, previous: Option<Layout>) -> Self {
        self.previous = previous.filter(|&p| p != self.layout);
        self
    }

    /// The dedupe window (`DEDUPE_TTL_SECONDS`; `None`: forever), which a
    /// reshard must outlast before the next one: while resharding, the first
    /// call of an isolate asks the layout registry, and a second reshard inside
    /// one window is refused (every call then fails with `Invalid`, naming the
    /// settings), so the first reshard's old layout is never dropped early.
    pub fn with_reshard_window(mut self, window: Option<Duration>) -> Self {
        self.window = window;
        self
    }

    /// Once per isolate, the layout registry's answer to this consumer's
    /// layouts (see [`DurableObjectStore::with_reshard_window`]): also without a
    /// previous layout, so that dropping `DEDUPE_PREVIOUS_SHARDS` inside the
    /// window, or changing `DEDUPE_SHARDS` without it, is refused instead of
    /// forgetting every moved id. One request per isolate.
    async fn check_layouts(&self) -> StoreResult<()> {
        let this = (self.layout, self.previous, self.window);
        if LAYOUT_ACCEPTED.with_borrow(|accepted| *accepted == Some(this)) {
            return Ok(());
        }
        let request = ShardRequest::Layouts {
            current: self.layout.setting(),
            previous: self.previous.map(|p| p.setting()),
            window_ms: self.window.map(wire_ms),
        };
        let reply = self.call(super::layouts::OBJECT, request).await?;
        if let Some(refused) = reply.refused {
            return Err(StoreError::new(StoreErrorKind::Invalid, refused));
        }
        LAYOUT_ACCEPTED.with_borrow_mut(|accepted| *accepted = Some(this));
        Ok(())
    }

    /// Counts this store's requests into `counter`.
    pub fn with_round_trips(mut self, counter: RoundTrips) -> Self {
        self.round_trips = counter;
        self
    }

    /// The counter of this store's requests (see [`Self::with_round_trips`]).
    pub fn round_trips(&self) -> &RoundTrips {
        &self.round_trips
    }

    /// How many shards the current layout has.
    pub fn shards(&self) -> u32 {
        self.layout.shards()
    }

    /// The current layout: where ids are claimed and written.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// While resharding: the layout before the change, also asked about moved ids.
    pub fn previous(&self) -> Option<Layout> {
        self.previous
    }

    /// The live rows of every shard (with `expired`, also expired rows not yet
    /// swept), up to `limit` per shard. The current layout only.
    pub async fn entries(&self, limit: u32, expired: bool) -> StoreResult<Vec<Entry>> {
        let replies = try_join_all((0..self.layout.shards()).map(|shard| {
            let object = self.layout.object_name(shard);
            async move {
                self.call(&object, ShardRequest::Entries { limit, expired })
                    .await
            }
        }))
        .await?;
        Ok(replies
            .into_iter()
            .flat_map(|r| r.entries.unwrap_or_default())
            .collect())
    }

    /// Groups key indexes by the object of `layout` holding them, in first-seen order.
    fn by_object<'k>(layout: Layout, keys: impl IntoIterator<Item = &'k str>) -> Vec<Group> {
        Self::by_object_of(layout, keys, placement_hash)
    }

    /// [`Self::by_object`] with the objects `hash` picks.
    fn by_object_of<'k>(
        layout: Layout,
        keys: impl IntoIterator<Item = &'k str>,
        hash: fn(&str) -> u64,
    ) -> Vec<Group> {
        let mut groups: Vec<Group> = Vec::new();
        for (i, key) in keys.into_iter().enumerate() {
            let object = layout.object_of_hash(hash(key));
            match groups.iter_mut().find(|g| g.object == object) {
                Some(group) => group.members.push(i),
                None => groups.push(Group {
                    object,
                    members: vec![i],
                }),
            }
        }
        groups
    }

    /// Is `key` in a different object in the previous layout than in this one
    /// (so the previous one must be asked about it)?
    fn moved(&self, key: &str) -> bool {
        self.previous.is_some_and(|previous| {
            let hash = placement_hash(key);
            previous.object_of_hash(hash) != self.layout.object_of_hash(hash)
        })
    }

    /// One request to one object.
    async fn call(&self, object: &str, request: ShardRequest) -> StoreResult<ShardReply> {
        self.round_trips.add(1);
        let unavailable = |what: &str, e: &dyn std::fmt::Display| {
            StoreError::unavailable(format!("dedupe shard {object}: {what}: {e}"))
        };
        let body = serde_json::to_string(&request).map_err(|e| unavailable("encode", &e))?;
        let stub = self
            .namespace
            .get_by_name(object)
            .map_err(|e| unavailable("stub", &e))?;
        let mut init = RequestInit::new();
        init.with_method(Method::Post)
            .with_body(Some(JsValue::from_str(&body)));
        let request = Request::new_with_init("https://dedupe-shard/rpc", &init)
            .map_err(|e| unavailable("request", &e))?;
        let mut response = stub
            .fetch_with_request(request)
            .await
            .map_err(|e| unavailable("fetch", &e))?;
        let status = response.status_code();
        if status != 200 {
            let text = response.text().await.unwrap_or_default();
            return Err(StoreError::backend(
                status >= 500,
                format!("dedupe shard {object}: HTTP {status}: {text}"),
            ));
        }
        let reply = response
            .json::<ShardReply>()
            .await
            .map_err(|e| unavailable("reply", &e))?;
        if let Some(rows) = reply.rows {
            self.round_trips.add_rows(rows.read, rows.written);
        }
        Ok(reply)
    }

    /// Sends `make(keys of the object)` to every object of `layout` holding one
    /// of `keys` (concurrently) and returns the replies with each object's key
    /// indexes.
    async fn fan_out(
        &self,
        (layout, hash): (Layout, fn(&str) -> u64),
        keys: &[&str],
        make: impl Fn(Vec<String>) -> ShardRequest,
    ) -> StoreResult<Vec<(Vec<usize>, ShardReply)>> {
        let groups = Self::by_object_of(layout, keys.iter().copied(), hash);
        try_join_all(groups.into_iter().map(|Group { object, members }| {
            let request = make(members.iter().map(|&i| keys[i].to_string()).collect());
            async move { Ok((members, self.call(&object, request).await?)) }
        }))
        .await
    }

    /// `seen` in `layout`.
    async fn seen_in(&self, layout: Layout, keys: &[&str]) -> StoreResult<Vec<bool>> {
        self.seen_where(layout, keys, placement_hash).await
    }

    /// `seen` in the objects of `layout` that `hash` picks.
    async fn seen_where(
        &self,
        layout: Layout,
        keys: &[&str],
        hash: fn(&str) -> u64,
    ) -> StoreResult<Vec<bool>> {
        let parts = self
            .fan_out((layout, hash), keys, |keys| ShardRequest::Seen { keys })
            .await?;
        let parts = parts.into_iter().map(|(m, r)| (m, r.seen)).collect();
        scatter(keys.len(), parts, "seen answers")
    }

    /// What `layout` knows of `keys` (read-only): done, or how long a claim
    /// has left (`ZERO`: free; `None`: held, by a shard that does not say).
    async fn peek_in(&self, layout: Layout, keys: &[&str]) -> StoreResult<Vec<Peeked>> {
        let parts = self
            .fan_out((layout, placement_hash), keys, |keys| ShardRequest::Peek {
                keys,
            })
            .await?;
        let parts = parts
            .into_iter()
            .map(|(members, reply)| {
                let states = reply.peek.map(|states| {
                    // Absent from a shard of a version before it: unknown.
                    let held = reply.held_ms.unwrap_or_default().into_iter();
                    let held = held.chain(std::iter::repeat(None));
                    let peeked = states.into_iter().zip(held);
                    peeked.map(|(state, ms)| state.peeked(ms)).collect()
                });
                (members, states)
            })
            .collect();
        scatter(keys.len(), parts, "peek answers")
    }

    /// Claims `keys` in `layout`, one request per object. If any object fails,
    /// the claims the others took are released (best effort) before the error
    /// is returned, so a partial failure does not park those ids for a whole
    /// lease.
    async fn claim_in(
        &self,
        layout: Layout,
        keys: &[&str],
        lease: Duration,
    ) -> StoreResult<Vec<Claim>> {
        let lease_ms = wire_ms(lease);
        let groups = Self::by_object(layout, keys.iter().copied());
        let replies = join_all(groups.into_iter().map(|Group { object, members }| {
            let request = ShardRequest::Claim {
                keys: members.iter().map(|&i| keys[i].to_string()).collect(),
                lease_ms,
            };
            async move { (members, self.call(&object, request).await) }
        }))
        .await;
        if let Some(error) = replies.iter().find_map(|(_, r)| r.as_ref().err()).cloned() {
            let mut taken: Vec<(&str, ClaimToken)> = Vec::new();
            for (members, reply) in &replies {
                let claims = reply.as_ref().ok().and_then(|r| r.claims.as_ref());
                for (&i, claim) in members.iter().zip(claims.into_iter().flatten()) {
                    if let Claim::Acquired(token) = claim {
                        taken.push((keys[i], token.clone()));
                    }
                }
            }
            self.release_in(layout, &taken).await;
            return Err(error);
        }
        let parts = replies
            .into_iter()
            .map(|(m, r)| (m, r.ok().and_then(|r| r.claims)))
            .collect();
        scatter(keys.len(), parts, "claims")
    }

    /// Gives claims taken in `layout` back, best effort.
    async fn release_in(&self, layout: Layout, taken: &[(&str, ClaimToken)]) {
        let groups = Self::by_object(layout, taken.iter().map(|(k, _)| *k));
        join_all(groups.into_iter().map(|Group { object, members }| {
            let release = members
                .iter()
                .map(|&i| claim_ref(taken[i].0, &taken[i].1.0))
                .collect();
            let request = ShardRequest::Settle(Step {
                release,
                lease_ms: Some(0),
                ..Step::default()
            });
            async move { self.call(&object, request).await }
        }))
        .await;
    }

    /// A fingerprint record not found beside its marker reads as a payload
    /// mismatch. Before 2026-12-07 a companion key sat in the object of its
    /// own hash, not its id's, and a success remembered then keeps its record
    /// there for its TTL: such a record is asked for there (in this layout,
    /// and while resharding in the previous one) before the guard calls it a
    /// mismatch (after an upgrade, same-payload duplicates were
    /// dead-lettered: a review). Only then: a real mismatch, or that case.
    async fn find_records_in_their_old_place(
        &self,
        keys: &[&str],
        seen: &mut [bool],
    ) -> StoreResult<()> {
        // (A scan, not a set: records are rarely missing, and a hash set
        // is some KB of wasm in every worker.)
        let present = |key: &str| (0..keys.len()).any(|j| seen[j] && keys[j] == key);
        let is_lone_record = |key: &str| {
            let id_key = bq_dedupe::fingerprint::owner_key(key);
            let marker = bq_dedupe::fingerprint::marker_key(id_key);
            id_key != key && key != marker && present(marker.as_str())
        };
        let lone: Vec<usize> = (0..keys.len())
            .filter(|&i| !seen[i] && is_lone_record(keys[i]))
            .collect();
        let layouts: Vec<Layout> = [Some(self.layout), self.previous]
            .into_iter()
            .flatten()
            .collect();
        // Each layout's old object of a record, unless already asked: its
        // id's object (in either layout), or its old one in a layout before.
        let not_yet_asked = |key: &str, n: usize| {
            let object = layouts[n].object_of_hash(key_hash(key));
            let ids = layouts
                .iter()
                .map(|l| l.object_of_hash(placement_hash(key)));
            let before = layouts[..n].iter().map(|l| l.object_of_hash(key_hash(key)));
            !ids.chain(before).any(|o| o == object)
        };
        for (n, &layout) in layouts.iter().enumerate() {
            let ask: Vec<usize> = lone
                .iter()
                .copied()
                .filter(|&i| !seen[i] && not_yet_asked(keys[i], n))
                .collect();
            if ask.is_empty() {
                continue;
            }
            let keys: Vec<&str> = ask.iter().map(|&i| keys[i]).collect();
            let found = self.seen_where(layout, &keys, key_hash).await?;
            for (&i, was) in ask.iter().zip(found) {
                seen[i] |= was;
            }
        }
        Ok(())
    }

    /// Where each part of an entry of a batch step goes: the key's object in
    /// this layout, and, while resharding, the key's object in the previous
    /// one too for a claim taken in both (a token `here+there`) and for a
    /// plain remember (the seen-set mode) of a moved key: an isolate still on
    /// the old layout, accepted before the reshard was registered, then sees
    /// it done.
    fn placements<'t>(&self, key: &str, token: Option<&'t str>) -> Vec<(String, Option<&'t str>)> {
        let hash = placement_hash(key);
        let here = self.layout.object_of_hash(hash);
        let there = (self.previous.map(|p| p.object_of_hash(hash))).filter(|t| *t != here);
        match (token, token.and_then(|t| t.split_once(BOTH)), there) {
            (_, Some((mine, theirs)), Some(there)) => {
                vec![(here, Some(mine)), (there, Some(theirs))]
            }
            (_, Some((mine, _)), None) => vec![(here, Some(mine))],
            (None, None, Some(there)) => vec![(here, None), (there, None)],
            (_, None, _) => vec![(here, token)],
        }
    }
}

/// Puts per-shard answers back in the order of the keys asked about.
fn scatter<T: Clone>(
    len: usize,
    parts: Vec<(Vec<usize>, Option<Vec<T>>)>,
    what: &str,
) -> StoreResult<Vec<T>> {
    let mut out: Vec<Option<T>> = vec![None; len];
    for (members, answers) in parts {
        let answers = answers.unwrap_or_default();
        if answers.len() != members.len() {
            return Err(StoreError::internal(format!(
                "dedupe shard answered {} {what} for {} keys",
                answers.len(),
                members.len()
            )));
        }
        for (i, answer) in members.into_iter().zip(answers) {
            out[i] = Some(answer);
        }
    }
    out.into_iter()
        .map(|a| a.ok_or_else(|| StoreError::internal(format!("a key got no {what}"))))
        .collect()
}

impl Store for DurableObjectStore {
    /// Forgets in the current layout and, while resharding, in the previous one.
    async fn forget(&self, key: &str) -> StoreResult<()> {
        let hash = placement_hash(key);
        let here = self.layout.object_of_hash(hash);
        let forget = |object: String| async move {
            let keys = vec![key.to_string()];
            self.call(&object, ShardRequest::Forget { keys }).await
        };
        match self.previous.map(|p| p.object_of_hash(hash)) {
            Some(there) if there != here => {
                try_join_all([forget(here), forget(there)]).await?;
            }
            _ => {
                forget(here).await?;
            }
        }
        Ok(())
    }

    fn kind(&self) -> &'static str {
        "durable-object"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::ALL
    }

    /// One request per object; while resharding, the keys the current layout
    /// does not know and that live elsewhere in the previous one are asked there
    /// (one more request per previous object touched); then a fingerprint
    /// record missing beside its marker in its old objects (more requests,
    /// only then: [`Self::find_records_in_their_old_place`]).
    async fn seen_many(&self, keys: &[&str]) -> StoreResult<Vec<bool>> {
        self.check_layouts().await?;
        let mut seen = self.seen_in(self.layout, keys).await?;
        if let Some(previous) = self.previous {
            let ask: Vec<usize> = (0..keys.len())
                .filter(|&i| !seen[i] && self.moved(keys[i]))
                .collect();
            if !ask.is_empty() {
                let asked: Vec<&str> = ask.iter().map(|&i| keys[i]).collect();
                let before = self.seen_in(previous, &asked).await?;
                for (&i, was) in ask.iter().zip(before) {
                    seen[i] = was;
                }
            }
        }
        // After both layouts: a marker found in the previous one counts.
        self.find_records_in_their_old_place(keys, &mut seen)
            .await?;
        Ok(seen)
    }

    /// Done, or how long a claim has left, in one request per object; while
    /// resharding, the keys not done here that live elsewhere in the previous
    /// layout are asked there too, and the longer claim counts.
    async fn peek_many(&self, keys: &[&str]) -> StoreResult<Vec<Peeked>> {
        self.check_layouts().await?;
        let mut peeked = self.peek_in(self.layout, keys).await?;
        let Some(previous) = self.previous else {
            return Ok(peeked);
        };
        let ask: Vec<usize> = (0..keys.len())
            .filter(|&i| peeked[i] != Peeked::Done && self.moved(keys[i]))
            .collect();
        if ask.is_empty() {
            return Ok(peeked);
        }
        let asked: Vec<&str> = ask.iter().map(|&i| keys[i]).collect();
        for (&i, there) in ask.iter().zip(self.peek_in(previous, &asked).await?) {
            peeked[i] = match (peeked[i], there) {
                (_, Peeked::Done) => Peeked::Done,
                (Peeked::NotDone { claim_ends_in: a }, Peeked::NotDone { claim_ends_in: b }) => {
                    Peeked::NotDone {
                        // Unknown on either side is unknown.
                        claim_ends_in: a.zip(b).map(|(a, b)| a.max(b)),
                    }
                }
                (here, _) => here,
            };
        }
        Ok(peeked)
    }

    async fn remember_many(&self, keys: &[&str], ttl: Option<Duration>) -> StoreResult<()> {
        let remember: Vec<(&str, Option<&ClaimToken>)> = keys.iter().map(|k| (*k, None)).collect();
        let step = Settlement {
            remember: &remember,
            ttl,
            ..Settlement::default()
        };
        self.settle(&step).await.map(drop)
    }

    /// One request per object. While resharding, a key claimed here that lives
    /// elsewhere in the previous layout is claimed there too (one request per
    /// previous object touched), so a consumer of either layout is fenced off
    /// from the other's claim: remembered there, it answers `Seen`; held there,
    /// `Held` (and the claim just taken here is given back); claimed there too,
    /// the token names both claims (`here+there`) and every later call on it
    /// goes to both objects.
    async fn claim_many(&self, keys: &[&str], lease: Duration) -> StoreResult<Vec<Claim>> {
        self.check_layouts().await?;
        let mut claims = self.claim_in(self.layout, keys, lease).await?;
        let Some(previous) = self.previous else {
            return Ok(claims);
        };
        let ask: Vec<usize> = (0..keys.len())
            .filter(|&i| matches!(claims[i], Claim::Acquired(_)) && self.moved(keys[i]))
            .collect();
        if ask.is_empty() {
            return Ok(claims);
        }
        let asked: Vec<&str> = ask.iter().map(|&i| keys[i]).collect();
        let taken_here = |claims: &[Claim]| -> Vec<(&str, ClaimToken)> {
            (0..keys.len())
                .filter_map(|i| match &claims[i] {
                    Claim::Acquired(token) => Some((keys[i], token.clone())),
                    _ => None,
                })
                .collect()
        };
        let there = match self.claim_in(previous, &asked, lease).await {
            Ok(there) => there,
            Err(e) => {
                self.release_in(self.layout, &taken_here(&claims)).await;
                return Err(e);
            }
        };
        let mut give_back: Vec<(&str, ClaimToken)> = Vec::new();
        for (&i, answer) in ask.iter().zip(there) {
            let Claim::Acquired(here) = std::mem::replace(&mut claims[i], Claim::Held) else {
                continue;
            };
            claims[i] = match answer {
                Claim::Acquired(theirs) => {
                    Claim::Acquired(ClaimToken(format!("{}{BOTH}{}", here.0, theirs.0)))
                }
                other => {
                    give_back.push((keys[i], here));
                    other
                }
            };
        }
        self.release_in(self.layout, &give_back).await;
        Ok(claims)
    }

    /// One request per object touched, each applied in the object's transaction.
    /// An entry whose claim was taken in both layouts (see
    /// [`Store::claim_many`]) goes to both objects and counts only if both
    /// answer yes (a fenced remember then records the id in both layouts). An
    /// object that fails with only releases to do is reported in
    /// [`Settled::release_error`] (its leases run out by themselves); one that
    /// fails with remembers or renewals fails the call, since what it recorded
    /// is unknown.
    async fn settle(&self, step: &Settlement<'_>) -> StoreResult<Settled> {
        self.check_layouts().await?;
        #[derive(Default)]
        struct Part {
            step: Step,
            remember_at: Vec<usize>,
            renew_at: Vec<usize>,
        }
        /// The part of the step that goes to `object` (first-seen order).
        fn part_for(parts: &mut Vec<(String, Part)>, object: String) -> &mut Part {
            let n = match parts.iter().position(|(o, _)| *o == object) {
                Some(n) => n,
                None => {
                    parts.push((object, Part::default()));
                    parts.len() - 1
                }
            };
            &mut parts[n].1
        }
        let mut parts: Vec<(String, Part)> = Vec::new();
        for (i, (key, token)) in step.remember.iter().enumerate() {
            for (object, token) in self.placements(key, token.map(|t| t.0.as_str())) {
                let p = part_for(&mut parts, object);
                p.step.remember.push(Remember {
                    key: key.to_string(),
                    token: token.map(|t| ClaimToken(t.to_string())),
                });
                p.remember_at.push(i);
            }
        }
        for (key, token) in step.release {
            for (object, token) in self.placements(key, Some(token.0.as_str())) {
                let release = claim_ref(key, token.unwrap_or_default());
                part_for(&mut parts, object).step.release.push(release);
            }
        }
        for (i, (key, token)) in step.renew.iter().enumerate() {
            for (object, token) in self.placements(key, Some(token.0.as_str())) {
                let p = part_for(&mut parts, object);
                p.step.renew.push(claim_ref(key, token.unwrap_or_default()));
                p.renew_at.push(i);
            }
        }
        let replies = join_all(parts.into_iter().map(|(object, mut p)| {
            p.step.ttl_ms = step.ttl.map(wire_ms);
            p.step.lease_ms = Some(wire_ms(step.lease));
            let request = ShardRequest::Settle(p.step);
            async move { (p.remember_at, p.renew_at, self.call(&object, request).await) }
        }))
        .await;
        let mut settled = Settled::default();
        let mut kept: Vec<Option<bool>> = vec![None; step.remember.len()];
        let mut renewed: Vec<Option<bool>> = vec![None; step.renew.len()];
        // Every part of an entry must say yes for the entry to.
        let fold = |into: &mut [Option<bool>], at: &[usize], answers: Option<Vec<bool>>, what| {
            let answers = answers.unwrap_or_default();
            if answers.len() != at.len() {
                return Err(StoreError::internal(format!(
                    "dedupe shard answered {} {what} for {} keys",
                    answers.len(),
                    at.len()
                )));
            }
            for (&i, yes) in at.iter().zip(answers) {
                into[i] = Some(into[i].unwrap_or(true) && yes);
            }
            Ok(())
        };
        for (remember_at, renew_at, reply) in replies {
            match reply {
                Ok(reply) => {
                    fold(&mut kept, &remember_at, reply.kept, "remember answers")?;
                    fold(&mut renewed, &renew_at, reply.renewed, "renew answers")?;
                }
                Err(e) if remember_at.is_empty() && renew_at.is_empty() => {
                    settled.release_error.get_or_insert(e);
                }
                Err(e) => return Err(e),
            }
        }
        let all = |answers: Vec<Option<bool>>, what: &str| {
            answers
                .into_iter()
                .map(|a| a.ok_or_else(|| StoreError::internal(format!("a key got no {what}"))))
                .collect::<StoreResult<Vec<bool>>>()
        };
        settled.kept = all(kept, "remember answer")?;
        settled.renewed = all(renewed, "renew answer")?;
        Ok(settled)
    }
}

/// Joins the two tokens of a claim taken in both layouts while resharding.
const BOTH: char = '+';

/// A key and the token of its claim, as the shard protocol carries them.
fn claim_ref(key: &str, token: &str) -> ClaimRef {
    ClaimRef {
        key: key.to_string(),
        token: ClaimToken(token.to_string()),
    }
}
