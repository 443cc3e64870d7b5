//! The runner: [`check`] (random runs from a seed, the smallest failing one
//! shrunk and printed), [`check_seeded`] and [`check_ops`] (one given run).
//! Beside the clients it keeps the model's side of a run (each key's possible
//! records, each client's tokens, each key's committed transactions), and its
//! executor makes each [`Op`]'s store call through the fault wrapper
//! ([`Faulty`]), splits the reply per key, and checks it against the model.

use std::time::Duration;

use bq_dedupe::block_on_ready;
use bq_dedupe::store::record::{Record, Rules};
use bq_dedupe::store::{Claim, ClaimToken, Peeked, Settled, Settlement, Store, StoreResult, TxRun};
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};

use crate::Harness;
use crate::fault::Faulty;
use crate::history::instants;
use crate::model::{KeyAnswer, KeyOp, next_records};
use crate::operations::{KEYS, Op, as_rust, ops};

/// Runs `cases` random runs, each on a fresh harness from `make`, and panics
/// with the smallest failing run it finds (as the `Op`s to give [`check_ops`])
/// and the seed that found it.
///
/// How many: a few hundred for an in-process store (a rule broken in one
/// corner took about a thousand in a review); tens for one on a server's real
/// clock, whose runs sleep. `PROPTEST_CASES` overrides `cases` for a longer run
/// by hand, and `BQ_TESTKIT_SEED` repeats a run that failed.
pub fn check<H: Harness>(cases: u32, make: impl Fn() -> H) {
    let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    let cases = env("PROPTEST_CASES").map_or(cases, |n| n as u32);
    let seed = env("BQ_TESTKIT_SEED").unwrap_or_else(|| {
        // Any varying value will do: the seed is printed with a failure.
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    if let Err(e) = check_seeded(cases, seed, make) {
        panic!("{e}");
    }
}

/// [`check`] from a given seed, reading no environment or clock of its own (a
/// host without them, as wasm32 in JS, passes its own): `Err` describes the
/// smallest failing run and names the seed.
pub fn check_seeded<H: Harness>(cases: u32, seed: u64, make: impl Fn() -> H) -> Result<(), String> {
    let (caps, clients, rules, transactional, take_claims) = {
        let mut h = make();
        (
            h.open().capabilities(),
            h.clients(),
            h.rules(),
            h.transactional(),
            h.transactions_take_claims(),
        )
    };
    if caps.renew && !rules.claims_have_owners {
        return Err(
            "the harness's Rules say claims have no owners, but the store's capabilities() \
             offer leases (renewals and fenced commits need owners): one of them is wrong"
                .into(),
        );
    }
    let config = Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    };
    let mut bytes = [0u8; 32];
    for chunk in bytes.chunks_mut(8) {
        chunk.copy_from_slice(&seed.to_le_bytes());
    }
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &bytes);
    let mut runner = TestRunner::new_with_rng(config, rng);
    runner
        .run(&ops(caps, clients, transactional, take_claims), |ops| {
            check_ops(&mut make(), &ops).map_err(TestCaseError::fail)
        })
        .map_err(|e| format!("store testkit (BQ_TESTKIT_SEED={seed}): {e}"))
}

/// One run of `ops` on `harness`: `Err` names the first answer the model does
/// not allow, with the run so far.
pub fn check_ops<H: Harness>(harness: &mut H, ops: &[Op]) -> Result<(), String> {
    let mut world = World::new(harness);
    for (n, op) in ops.iter().enumerate() {
        world.step(harness, op).map_err(|e| {
            let tick = harness.tick_ms();
            format!(
                "step {n} {op:?}: {e}\n(the run's times are ticks of {tick} ms; the \
                     answers' are ms)\nrun, to give `check_ops`: {}",
                as_rust(&ops[..=n])
            )
        })?;
    }
    Ok(())
}

/// The model's side of a run, beside the clients.
struct World<C: Store> {
    rules: Rules,
    /// Per key, every record it may be in (more than one only where a call's
    /// time was too close to a deadline to tell which way it went).
    records: Vec<Vec<Record>>,
    clients: Vec<Faulty<C>>,
    /// `tokens[client][key]`: every token the client was given for the key.
    tokens: Vec<Vec<Vec<ClaimToken>>>,
    /// Per key, the transactions the store answered committed.
    committed: Vec<u64>,
    tick: u64,
    /// The backend keeps its own time (a slack around each call): a call is
    /// tried at instants inside its window too, not only at its two ends.
    real_clock: bool,
}

impl<C: Store> World<C> {
    fn new<H: Harness<Client = C>>(h: &mut H) -> Self {
        let n = h.clients().max(1);
        World {
            rules: h.rules(),
            records: vec![vec![Record::Free]; KEYS.len()],
            clients: (0..n).map(|_| Faulty::new(h.open())).collect(),
            tokens: vec![vec![Vec::new(); KEYS.len()]; n],
            committed: vec![0; KEYS.len()],
            tick: h.tick_ms(),
            real_clock: h.slack_ms() > 0,
        }
    }

    fn token(&self, client: usize, key: usize, pick: usize) -> ClaimToken {
        let held = &self.tokens[client][key];
        match held.len() {
            0 => ClaimToken("never-issued".into()),
            n => held[pick % n].clone(),
        }
    }

    fn ms(&self, ticks: u64) -> u64 {
        ticks * self.tick
    }

    fn step<H: Harness<Client = C>>(&mut self, h: &mut H, op: &Op) -> Result<(), String> {
        let (client, parts) = match op {
            Op::Advance { ticks } => {
                h.advance(self.ms(*ticks));
                return Ok(());
            }
            Op::Crash { client } => {
                self.clients[*client] = Faulty::new(h.open());
                self.tokens[*client] = vec![Vec::new(); KEYS.len()];
                return Ok(());
            }
            Op::Arm { client, fault } => {
                self.clients[*client].arm(*fault);
                return Ok(());
            }
            Op::Transact {
                client,
                key,
                claim,
                ttl,
                ok,
            } => {
                let claim = claim.map(|pick| self.token(*client, *key, pick));
                return self.transact(h, *client, *key, claim, *ttl, *ok);
            }
            op => self.parts(op),
        };
        let lo = h.now_ms().saturating_sub(h.slack_ms());
        let (reply, swallowed) = call(&self.clients[client], op, &parts, self.tick);
        let hi = h.now_ms() + h.slack_ms();
        // A reply the fault kept from the caller happened first: check it first.
        if let Some(first) = swallowed {
            let first = first.map_err(|e| format!("the store failed under a fault: {e}"))?;
            self.settle_answers(client, &parts, &first, (lo, hi), false)?;
        }
        match reply {
            Ok(answers) => self.settle_answers(client, &parts, &answers, (lo, hi), true),
            Err(e) if e.message.starts_with("injected fault") => Ok(()),
            Err(e) => Err(format!("the store failed: {e}")),
        }
    }

    /// A transaction: its answer checked as a call's, then the key's effect
    /// rows counted against its committed transactions.
    fn transact<H: Harness<Client = C>>(
        &mut self,
        h: &mut H,
        client: usize,
        key: usize,
        claim: Option<ClaimToken>,
        ttl: Option<u64>,
        ok: bool,
    ) -> Result<(), String> {
        let lo = h.now_ms().saturating_sub(h.slack_ms());
        let ttl_ms = ttl.map(|t| self.ms(t));
        let run = h.transact(
            self.clients[client].inner(),
            KEYS[key],
            ttl_ms.map(Duration::from_millis),
            claim.as_ref(),
            ok,
        );
        let hi = h.now_ms() + h.slack_ms();
        let run = run.map_err(|e| format!("the transaction failed: {e}"))?;
        if run == TxRun::Committed(()) {
            self.committed[key] += 1;
        }
        let part = [(key, KeyOp::Transact(claim, ttl_ms, ok))];
        self.settle_answers(client, &part, &[KeyAnswer::Tx(run)], (lo, hi), true)?;
        let effects = h.effects(KEYS[key]);
        if effects != self.committed[key] {
            return Err(format!(
                "key {:?}: {effects} effect rows for {} committed transactions",
                KEYS[key], self.committed[key]
            ));
        }
        Ok(())
    }

    /// The per-key parts of a call.
    fn parts(&self, op: &Op) -> (usize, Vec<(usize, KeyOp)>) {
        let ms = |t: u64| self.ms(t);
        match op {
            Op::Seen { client, keys } => {
                (*client, keys.iter().map(|&k| (k, KeyOp::Seen)).collect())
            }
            Op::Peek { client, keys } => {
                (*client, keys.iter().map(|&k| (k, KeyOp::Peek)).collect())
            }
            Op::Remember { client, keys, ttl } => (
                *client,
                keys.iter()
                    .map(|&k| (k, KeyOp::Remember(ttl.map(ms))))
                    .collect(),
            ),
            Op::Forget { client, key } => (*client, vec![(*key, KeyOp::Forget)]),
            Op::Claim {
                client,
                keys,
                lease,
            } => (
                *client,
                keys.iter()
                    .map(|&k| (k, KeyOp::Claim(ms(*lease))))
                    .collect(),
            ),
            Op::Renew {
                client,
                key,
                token,
                lease,
            } => (
                *client,
                vec![(
                    *key,
                    KeyOp::Renew(self.token(*client, *key, *token), ms(*lease)),
                )],
            ),
            Op::Release { client, key, token } => (
                *client,
                vec![(*key, KeyOp::Release(self.token(*client, *key, *token)))],
            ),
            Op::Commit {
                client,
                key,
                token,
                ttl,
            } => (
                *client,
                vec![(
                    *key,
                    KeyOp::Commit(self.token(*client, *key, *token), ttl.map(ms)),
                )],
            ),
            Op::Settle {
                client,
                release,
                renew,
                remember,
                ttl,
                lease,
            } => {
                let c = *client;
                let mut parts = Vec::new();
                for &(k, t) in release {
                    parts.push((k, KeyOp::Release(self.token(c, k, t))));
                }
                for &(k, t) in renew {
                    parts.push((k, KeyOp::Renew(self.token(c, k, t), ms(*lease))));
                }
                for &(k, t) in remember {
                    parts.push(match t {
                        Some(t) => (k, KeyOp::Commit(self.token(c, k, t), ttl.map(ms))),
                        None => (k, KeyOp::Remember(ttl.map(ms))),
                    });
                }
                (c, parts)
            }
            Op::Advance { .. } | Op::Crash { .. } | Op::Arm { .. } | Op::Transact { .. } => {
                (0, Vec::new())
            }
        }
    }

    /// Checks each key's answer against the model at either end of `(lo, hi)`
    /// and moves the model as the answer says. `learn`: the caller got the reply
    /// (so it now holds the tokens it was given).
    fn settle_answers(
        &mut self,
        client: usize,
        parts: &[(usize, KeyOp)],
        answers: &[KeyAnswer],
        (lo, hi): (u64, u64),
        learn: bool,
    ) -> Result<(), String> {
        if answers.len() != parts.len() {
            return Err(format!(
                "{} answers for {} keys: {answers:?}",
                answers.len(),
                parts.len()
            ));
        }
        // On a real clock a deadline a call set may fall between two later
        // calls' instants, which its window's ends alone cannot reach: a TTL
        // that had run out inside a later `seen`'s window, where a deadline
        // from either end of the remember's window was still ahead (seed
        // 1796411858665986247, PostgreSQL over TLS, in `make test`).
        let windows = match self.real_clock {
            true => instants((lo, hi), None),
            false => vec![(lo, hi)],
        };
        for ((key, part), got) in parts.iter().zip(answers) {
            let mut next: Vec<Record> = Vec::new();
            let mut refused = None;
            for &window in &windows {
                match next_records(&self.records[*key], self.rules, part, got, window) {
                    Ok(records) => {
                        for r in records {
                            if !next.contains(&r) {
                                next.push(r);
                            }
                        }
                    }
                    Err(e) => refused = refused.or(Some(e)),
                }
            }
            if next.is_empty() {
                let e = refused.unwrap_or_default();
                return Err(format!("key {:?} ({part:?}): {e}", KEYS[*key]));
            }
            self.records[*key] = next;
            if learn && let KeyAnswer::Claim(_, Some(t)) = got {
                self.tokens[client][*key].push(t.clone());
            }
        }
        Ok(())
    }
}

/// Makes the call `op` stands for on `store`; answers its reply split per key,
/// and the reply a fault swallowed (if one did), split the same way.
fn call<C: Store>(
    store: &Faulty<C>,
    op: &Op,
    parts: &[(usize, KeyOp)],
    tick: u64,
) -> (
    StoreResult<Vec<KeyAnswer>>,
    Option<StoreResult<Vec<KeyAnswer>>>,
) {
    let keys: Vec<&str> = parts.iter().map(|(k, _)| KEYS[*k]).collect();
    let dur = |ticks: u64| Duration::from_millis(ticks * tick);
    let ttl = |t: &Option<u64>| t.map(dur);
    fn wait<T>(f: impl std::future::Future<Output = StoreResult<T>>) -> StoreResult<T> {
        block_on_ready(f).unwrap_or_else(|_| {
            Err(bq_dedupe::StoreError::internal(
                "the store did not complete synchronously",
            ))
        })
    }
    fn each<T>(r: StoreResult<Vec<T>>, f: impl Fn(T) -> KeyAnswer) -> StoreResult<Vec<KeyAnswer>> {
        r.map(|v| v.into_iter().map(f).collect())
    }
    fn one<T>(r: StoreResult<T>, f: impl Fn(T) -> KeyAnswer) -> StoreResult<Vec<KeyAnswer>> {
        r.map(|v| vec![f(v)])
    }
    let n = keys.len();
    let done = move |()| vec![KeyAnswer::Done; n];
    macro_rules! with_swallowed {
        ($reply:expr, $ty:ty, $split:expr) => {{
            let split = $split;
            let reply = split(wait($reply));
            let swallowed = store.take_swallowed::<StoreResult<$ty>>().map(split);
            (reply, swallowed)
        }};
    }
    match (op, parts) {
        (Op::Seen { .. }, [_]) => {
            with_swallowed!(store.seen(keys[0]), bool, |r| one(r, KeyAnswer::Bool))
        }
        (Op::Seen { .. }, _) => with_swallowed!(store.seen_many(&keys), Vec<bool>, |r| each(
            r,
            KeyAnswer::Bool
        )),
        (Op::Peek { .. }, _) => {
            with_swallowed!(store.peek_many(&keys), Vec<Peeked>, |r| each(
                r,
                KeyAnswer::Peek
            ))
        }
        (Op::Remember { ttl: t, .. }, [_]) => {
            with_swallowed!(store.remember(keys[0], ttl(t)), (), |r: StoreResult<()>| r
                .map(done))
        }
        (Op::Remember { ttl: t, .. }, _) => {
            with_swallowed!(store.remember_many(&keys, ttl(t)), (), |r: StoreResult<
                (),
            >| r
                .map(done))
        }
        (Op::Forget { .. }, _) => {
            with_swallowed!(store.forget(keys[0]), (), |r: StoreResult<()>| r.map(done))
        }
        (Op::Claim { lease, .. }, [_]) => {
            with_swallowed!(store.claim(keys[0], dur(*lease)), Claim, |r| one(
                r,
                KeyAnswer::from
            ))
        }
        (Op::Claim { lease, .. }, _) => {
            with_swallowed!(store.claim_many(&keys, dur(*lease)), Vec<Claim>, |r| each(
                r,
                KeyAnswer::from
            ))
        }
        (Op::Renew { lease, .. }, [(_, KeyOp::Renew(token, _))]) => {
            with_swallowed!(store.renew(keys[0], token, dur(*lease)), bool, |r| one(
                r,
                KeyAnswer::Bool
            ))
        }
        (Op::Release { .. }, [(_, KeyOp::Release(token))]) => {
            with_swallowed!(store.release(keys[0], token), (), |r: StoreResult<()>| r
                .map(done))
        }
        (Op::Commit { ttl: t, .. }, [(_, KeyOp::Commit(token, _))]) => {
            with_swallowed!(
                store.remember_fenced(keys[0], token, ttl(t)),
                bool,
                |r| one(r, KeyAnswer::Bool)
            )
        }
        (Op::Settle { ttl: t, lease, .. }, parts) => {
            let mut release = Vec::new();
            let mut renew = Vec::new();
            let mut remember = Vec::new();
            for (key, part) in parts {
                match part {
                    KeyOp::Release(token) => release.push((KEYS[*key], token)),
                    KeyOp::Renew(token, _) => renew.push((KEYS[*key], token)),
                    KeyOp::Commit(token, _) => remember.push((KEYS[*key], Some(token))),
                    _ => remember.push((KEYS[*key], None)),
                }
            }
            let step = Settlement {
                remember: &remember,
                ttl: ttl(t),
                release: &release,
                renew: &renew,
                lease: dur(*lease),
            };
            let (r, nr) = (release.len(), renew.len());
            let split = move |s: StoreResult<Settled>| {
                s.and_then(|s| {
                    if let Some(e) = s.release_error {
                        return Err(e);
                    }
                    let mut answers = vec![KeyAnswer::Done; r];
                    answers.extend(s.renewed.into_iter().map(KeyAnswer::Bool));
                    answers.extend(s.kept.into_iter().map(KeyAnswer::Bool));
                    // Plain remembers answer `true`; the model says done.
                    for (a, part) in answers.iter_mut().zip(parts).skip(r + nr) {
                        if matches!(part.1, KeyOp::Remember(_)) && *a == KeyAnswer::Bool(true) {
                            *a = KeyAnswer::Done;
                        }
                    }
                    Ok(answers)
                })
            };
            let reply = split(wait(store.settle(&step)));
            let swallowed = store.take_swallowed::<StoreResult<Settled>>().map(split);
            (reply, swallowed)
        }
        _ => (Ok(Vec::new()), None),
    }
}
