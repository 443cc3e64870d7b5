//! The history checker: several clients call one store at once, each call is
//! recorded with when it was invoked and when it completed and what it answered
//! (or *unknown*, when it failed: it may or may not have taken effect), and each
//! key's history must be linearizable against the record model
//! ([`crate::store::record`]): some order of its calls, each taking effect at an
//! instant inside its own window, in which every answer is the model's.
//!
//! The search is Wing and Gong's, as porcupine and Knossos run it: pick any
//! call invoked before the earliest completion still pending, apply it to the
//! model, recurse, backtrack; memoised on (calls done, model state). Keys are
//! independent, so each key's history (a few dozen calls) is searched alone.
//!
//! Faults come from [`Faulty`] (a call failing before, or after it took effect,
//! or sent twice), from clients crashing (reopened, knowing no tokens) and
//! pausing past their leases, and from whatever the backend's own errors are
//! (recorded as unknown).

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::fault::{Fault, Faulty};
use super::run::{KeyAnswer, KeyOp, next_records};
use crate::block_on_ready;
use crate::store::record::{Record, Rules};
use crate::store::{Claim, ClaimToken, Peeked, Settled, Settlement, Store, StoreResult, TxRun};

/// The keys of a concurrent run: few, so that clients meet on them; one of
/// them an id some backends cannot hold as it is (U+0000, and longer than a
/// PostgreSQL index entry), which must still be its own record.
static KEYS: std::sync::LazyLock<[String; 3]> = std::sync::LazyLock::new(|| {
    let noise = incompressible(0x2545_f491_4f6c_dd1d, 400);
    [
        "60a7c782-d326-426c-876e-7fc44dd0bb78".to_string(),
        "order:1042".to_string(),
        format!("hostile:\u{0}:{noise}"),
    ]
});

/// `words` x 16 hex digits no compressor shrinks (xorshift from `seed`): an id
/// longer than a PostgreSQL index entry can hold even compressed.
pub fn incompressible(seed: u64, words: usize) -> String {
    let mut x = seed;
    (0..words)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            format!("{x:016x}")
        })
        .collect()
}

/// A transaction of the backend's transactional mode, as [`super::Harness::transact`].
pub type FleetTransact<C> =
    Arc<dyn Fn(&C, &str, Option<Duration>, bool) -> StoreResult<TxRun<(), ()>> + Send + Sync>;

/// How many effect rows a key's committed transactions left.
type FleetEffects = Box<dyn Fn(&str) -> u64>;

/// A backend under concurrent test: how each client connects, how time moves.
/// Built fresh for each run (its keys must start free).
pub struct Fleet<C> {
    open: Arc<dyn Fn() -> C + Send + Sync>,
    rules: Rules,
    now_ms: Arc<dyn Fn() -> u64 + Send + Sync>,
    advance: Arc<dyn Fn(u64) + Send + Sync>,
    tick_ms: u64,
    slack_ms: u64,
    clients: usize,
    steps: usize,
    transactions: Option<(FleetTransact<C>, FleetEffects)>,
    backend_errors: bool,
    _cleanup: Box<dyn std::any::Any>,
}

impl<C> std::fmt::Debug for Fleet<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet")
            .field("rules", &self.rules)
            .field("clients", &self.clients)
            .field("tick_ms", &self.tick_ms)
            .finish_non_exhaustive()
    }
}

impl<C: Store + Send + 'static> Fleet<C> {
    /// Clients from `open` on a server that keeps its own time: real time,
    /// 40 ms ticks, 8 ms slack, 4 clients of 16 calls each.
    pub fn new(rules: Rules, open: impl Fn() -> C + Send + Sync + 'static) -> Self {
        let started = std::time::Instant::now();
        Fleet {
            open: Arc::new(open),
            rules,
            // From an offset, so a window's lower end does not stop at 0.
            now_ms: Arc::new(move || 1_000_000 + started.elapsed().as_millis() as u64),
            advance: Arc::new(|ms| std::thread::sleep(Duration::from_millis(ms))),
            tick_ms: 40,
            slack_ms: 8,
            clients: 4,
            steps: 16,
            transactions: None,
            backend_errors: false,
            _cleanup: Box::new(()),
        }
    }

    /// A store on a clock the test moves ([`crate::ManualClock`]): `now_ms`
    /// reads it and `advance` moves it (a client's step, concurrent with the
    /// others'); no slack, ticks of `tick_ms`.
    pub fn with_clock(
        mut self,
        now_ms: impl Fn() -> u64 + Send + Sync + 'static,
        advance: impl Fn(u64) + Send + Sync + 'static,
        tick_ms: u64,
    ) -> Self {
        self.now_ms = Arc::new(now_ms);
        self.advance = Arc::new(advance);
        (self.tick_ms, self.slack_ms) = (tick_ms, 0);
        self
    }

    /// Other timing for a server: its tick, and how far its clock may be from ours.
    pub fn with_timing(mut self, tick_ms: u64, slack_ms: u64) -> Self {
        (self.tick_ms, self.slack_ms) = (tick_ms, slack_ms);
        self
    }

    /// How many clients, and how many calls each makes.
    pub fn with_clients(mut self, clients: usize, steps: usize) -> Self {
        (self.clients, self.steps) = (clients.max(1), steps);
        self
    }

    /// The backend's transactional mode: runs include transactions (as
    /// [`super::Harness::transact`]), and after a run each key's effect rows
    /// (`effects`) must number its committed transactions (give or take the
    /// ones whose answer was lost).
    pub fn with_transactions(
        mut self,
        transact: impl Fn(&C, &str, Option<Duration>, bool) -> StoreResult<TxRun<(), ()>>
        + Send
        + Sync
        + 'static,
        effects: impl Fn(&str) -> u64 + 'static,
    ) -> Self {
        self.transactions = Some((Arc::new(transact), Box::new(effects)));
        self
    }

    /// The backend's own errors are part of the test (a fault it injects
    /// itself): recorded as unknown instead of failing the run.
    pub fn with_backend_errors(mut self) -> Self {
        self.backend_errors = true;
        self
    }

    /// Keeps `cleanup` (whose `Drop` removes the run's records) until the
    /// fleet is dropped.
    pub fn with_cleanup(mut self, cleanup: impl std::any::Any) -> Self {
        self._cleanup = Box::new(cleanup);
        self
    }
}

/// One key's part of a call, as the history holds it.
#[derive(Debug, Clone)]
struct KeyCall {
    client: usize,
    op: KeyOp,
    /// `None`: unknown (the call failed; it may or may not have taken effect).
    answer: Option<KeyAnswer>,
    /// Global order of the invocation and the completion (`u64::MAX`: never
    /// completed, as far as anyone knows).
    invoked: u64,
    completed: u64,
    /// The instants, on the backend's clock, between which it took effect.
    window: (u64, u64),
}

/// Runs `runs` concurrent runs, each on a fresh fleet from `make`, and panics
/// with the first key whose history is not linearizable, the seed, and the
/// command that repeats the run. `BQ_TESTKIT_SEED` repeats a run (the same
/// calls by each client; the interleaving is the machine's), `BQ_HISTORY_RUNS`
/// overrides `runs` and `BQ_HISTORY_CLIENTS` the number of clients.
pub fn check_histories<C: Store + Send + 'static>(runs: u32, make: impl Fn() -> Fleet<C>) {
    let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    let runs = env("BQ_HISTORY_RUNS").map_or(runs, |n| n as u32);
    let fixed = env("BQ_TESTKIT_SEED");
    let clients = env("BQ_HISTORY_CLIENTS").filter(|&n| n > 0);
    let first = fixed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    for run in 0..runs {
        let seed = if fixed.is_some() {
            first
        } else {
            first.wrapping_add(u64::from(run).wrapping_mul(0x9e37_79b9_7f4a_7c15))
        };
        let mut fleet = make();
        if let Some(clients) = clients {
            // As many calls in all, spread over more clients (a key's history
            // holds at most 128).
            let total = fleet.clients * fleet.steps;
            fleet.clients = clients as usize;
            fleet.steps = (total / fleet.clients).max(4);
        }
        if let Err(e) = check_history(&fleet, seed) {
            let test = std::thread::current()
                .name()
                .unwrap_or("the test")
                .to_string();
            panic!(
                "history checker (BQ_TESTKIT_SEED={seed}, {} clients): {e}\nrepeat it: \
                 BQ_TESTKIT_SEED={seed} BQ_HISTORY_RUNS=1 BQ_HISTORY_CLIENTS={} cargo test \
                 {test} -- --exact \
                 (with the services `make test` starts: scripts/with-*.sh)",
                fleet.clients, fleet.clients
            );
        }
    }
}

/// One concurrent run from `seed`: `Err` names the key whose history no order
/// explains, with that history.
pub fn check_history<C: Store + Send + 'static>(fleet: &Fleet<C>, seed: u64) -> Result<(), String> {
    let clock = Arc::new(AtomicU64::new(0));
    type Calls = Result<Vec<(usize, KeyCall)>, String>;
    let histories: Vec<std::thread::JoinHandle<Calls>> = (0..fleet.clients)
        .map(|client| {
            let mut worker = Client {
                id: client,
                open: fleet.open.clone(),
                store: Faulty::new((fleet.open)()),
                tokens: vec![Vec::new(); KEYS.len()],
                rng: Rng(seed ^ (client as u64 + 1).wrapping_mul(0xd1b5_4a32_d192_ed03)),
                now_ms: fleet.now_ms.clone(),
                advance: fleet.advance.clone(),
                tick: fleet.tick_ms,
                slack: fleet.slack_ms,
                order: clock.clone(),
                transact: fleet.transactions.as_ref().map(|(t, _)| t.clone()),
                backend_errors: fleet.backend_errors,
                calls: Vec::new(),
            };
            let steps = fleet.steps;
            std::thread::spawn(move || {
                for _ in 0..steps {
                    worker.step()?;
                }
                Ok(worker.calls)
            })
        })
        .collect();
    let mut calls: Vec<Vec<KeyCall>> = vec![Vec::new(); KEYS.len()];
    for handle in histories {
        let client_calls = handle
            .join()
            .map_err(|_| "a client thread panicked".to_string())??;
        for (key, call) in client_calls {
            calls[key].push(call);
        }
    }
    for (key, history) in calls.iter().enumerate() {
        // The instants a call may have taken effect at (see `instants`).
        let ticks = (fleet.slack_ms == 0).then_some(fleet.tick_ms);
        linearizable(history, fleet.rules, ticks).map_err(|e| {
            let mut sorted = history.clone();
            sorted.sort_by_key(|c| c.invoked);
            let lines: Vec<String> = sorted
                .iter()
                .map(|c| {
                    format!(
                        "  client {} [{}..{}] at ms {:?}: {:?} -> {:?}",
                        c.client,
                        c.invoked,
                        if c.completed == u64::MAX {
                            "?".to_string()
                        } else {
                            c.completed.to_string()
                        },
                        c.window,
                        c.op,
                        c.answer
                    )
                })
                .collect();
            format!(
                "key {:?}: {e}; its history ({} calls):\n{}",
                shown(&KEYS[key]),
                history.len(),
                lines.join("\n")
            )
        })?;
    }
    if let Some((_, effects)) = &fleet.transactions {
        for (key, history) in calls.iter().enumerate() {
            let committed = history
                .iter()
                .filter(|c| matches!(c.answer, Some(KeyAnswer::Tx(TxRun::Committed(())))))
                .count() as u64;
            let unknown = history
                .iter()
                .filter(|c| matches!(c.op, KeyOp::Transact(..)) && c.answer.is_none())
                .count() as u64;
            let rows = effects(&KEYS[key]);
            if !(committed..=committed + unknown).contains(&rows) {
                return Err(format!(
                    "key {:?}: {rows} effect rows for {committed} committed transactions \
                     ({unknown} unknown)",
                    shown(&KEYS[key])
                ));
            }
        }
    }
    Ok(())
}

/// A key as a message shows it: a long one cut short.
fn shown(key: &str) -> String {
    match key.char_indices().nth(40) {
        Some((end, _)) => format!("{}... ({} bytes)", &key[..end], key.len()),
        None => key.to_string(),
    }
}

/// Whether some order of `calls` explains every answer (see the module docs).
fn linearizable(calls: &[KeyCall], rules: Rules, ticks: Option<u64>) -> Result<(), String> {
    if calls.len() > 128 {
        return Err(format!("{} calls on one key: at most 128", calls.len()));
    }
    let all_known: u128 = calls
        .iter()
        .enumerate()
        .filter(|(_, c)| c.answer.is_some())
        .fold(0, |m, (i, _)| m | (1 << i));
    let mut seen: HashSet<(u128, String)> = HashSet::new();
    let mut deepest = 0u32;
    // Depth-first, iteratively: (calls done, the records the key may be in).
    let mut stack: Vec<(u128, Vec<Record>)> = vec![(0, vec![Record::Free])];
    while let Some((done, records)) = stack.pop() {
        if done & all_known == all_known {
            return Ok(());
        }
        if !seen.insert((done, format!("{records:?}"))) {
            continue;
        }
        deepest = deepest.max(done.count_ones());
        // Calls still pending that completed before a call began must go first.
        let horizon = calls
            .iter()
            .enumerate()
            .filter(|(i, c)| done & (1 << i) == 0 && c.answer.is_some())
            .map(|(_, c)| c.completed)
            .min()
            .unwrap_or(u64::MAX);
        for (i, call) in calls.iter().enumerate() {
            if done & (1 << i) != 0 || call.invoked > horizon {
                continue;
            }
            let next = match &call.answer {
                Some(got) => {
                    let mut next: Vec<Record> = Vec::new();
                    for window in instants(call.window, ticks) {
                        for r in
                            next_records(&records, rules, &call.op, got, window).unwrap_or_default()
                        {
                            if !next.contains(&r) {
                                next.push(r);
                            }
                        }
                    }
                    (!next.is_empty()).then_some(next)
                }
                None => Some(any_effect(&records, rules, call, i)),
            };
            if let Some(next) = next {
                stack.push((done | (1 << i), next));
            }
        }
    }
    Err(format!(
        "not linearizable against the record model (at most {deepest} of its calls could be \
         ordered)"
    ))
}

/// The windows to try a call at. On a clock the clients move in ticks: each
/// tick it spanned (at most 64; a longer call keeps its two ends). On a real
/// clock: its whole window (both ends, and a claim's time left anywhere
/// between), and instants spread across it, since a deadline it set may fall
/// between two later calls' instants that its ends alone cannot reach.
fn instants((lo, hi): (u64, u64), ticks: Option<u64>) -> Vec<(u64, u64)> {
    match ticks {
        Some(tick) if tick > 0 && hi > lo && (hi - lo) / tick <= 64 => {
            let mut at: Vec<(u64, u64)> =
                (lo..=hi).step_by(tick as usize).map(|t| (t, t)).collect();
            if at.last() != Some(&(hi, hi)) {
                at.push((hi, hi));
            }
            at
        }
        None if hi > lo && hi - lo < 1 << 20 => {
            const INSIDE: u64 = 7;
            let mut at = vec![(lo, hi)];
            for n in 1..=INSIDE {
                let t = lo + (hi - lo) * n / (INSIDE + 1);
                if !at.contains(&(t, t)) {
                    at.push((t, t));
                }
            }
            at
        }
        _ => vec![(lo, hi)],
    }
}

/// The records after a call whose answer was lost took effect (with whatever
/// answer the model gives), at either end of its window.
fn any_effect(records: &[Record], rules: Rules, call: &KeyCall, index: usize) -> Vec<Record> {
    let mut next: Vec<Record> = Vec::new();
    let (lo, hi) = call.window;
    for record in records {
        for now in [lo, hi.min(lo.saturating_add(1 << 40))] {
            let mut r = record.clone();
            let token = ClaimToken(format!("(lost reply of call {index})"));
            super::run::apply(&mut r, rules, now, &call.op, Some(token));
            if !next.contains(&r) {
                next.push(r);
            }
        }
    }
    next
}

/// A small deterministic generator (xorshift64*), one per client.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n.max(1)
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

/// One client of a run, on its own thread.
struct Client<C> {
    id: usize,
    open: Arc<dyn Fn() -> C + Send + Sync>,
    store: Faulty<C>,
    tokens: Vec<Vec<ClaimToken>>,
    rng: Rng,
    now_ms: Arc<dyn Fn() -> u64 + Send + Sync>,
    advance: Arc<dyn Fn(u64) + Send + Sync>,
    tick: u64,
    slack: u64,
    order: Arc<AtomicU64>,
    transact: Option<FleetTransact<C>>,
    backend_errors: bool,
    calls: Vec<(usize, KeyCall)>,
}

impl<C: Store> Client<C> {
    fn token(&mut self, key: usize) -> ClaimToken {
        let held = &self.tokens[key];
        if held.is_empty() || self.rng.below(8) == 0 {
            return ClaimToken(format!("never-issued-{}", self.id));
        }
        held[self.rng.below(held.len() as u64) as usize].clone()
    }

    fn keys(&mut self) -> Vec<usize> {
        let mut keys: Vec<usize> = (0..KEYS.len()).filter(|_| self.rng.below(2) == 0).collect();
        if keys.is_empty() {
            keys.push(self.rng.below(KEYS.len() as u64) as usize);
        }
        keys
    }

    fn ttl(&mut self) -> Option<u64> {
        let caps = self.store.inner().capabilities();
        match self.rng.below(3) {
            0 if caps.ttl => Some((1 + self.rng.below(3)) * self.tick),
            1 if caps.ttl => Some(12 * self.tick),
            _ => None,
        }
    }

    fn lease(&mut self) -> u64 {
        *self.rng.pick(&[1, 2, 3, 12]) * self.tick
    }

    /// One random step: a call (maybe under a fault), a pause, or a crash.
    fn step(&mut self) -> Result<(), String> {
        let caps = self.store.inner().capabilities();
        match self.rng.below(20) {
            // A pause, sometimes past every lease a run takes.
            0 => {
                let ticks = *self.rng.pick(&[1, 2, 5]);
                (self.advance)(ticks * self.tick);
                return Ok(());
            }
            1 => {
                self.store = Faulty::new((self.open)());
                self.tokens = vec![Vec::new(); KEYS.len()];
                return Ok(());
            }
            2 => {
                let fault = *self.rng.pick(&[Fault::Before, Fault::After, Fault::Resend]);
                self.store.arm(fault);
            }
            _ => {}
        }
        let key = self.rng.below(KEYS.len() as u64) as usize;
        let parts: Vec<(usize, KeyOp)> = match self.rng.below(11) {
            0 => self.keys().into_iter().map(|k| (k, KeyOp::Seen)).collect(),
            1 => self.keys().into_iter().map(|k| (k, KeyOp::Peek)).collect(),
            2 => {
                let ttl = self.ttl();
                self.keys()
                    .into_iter()
                    .map(|k| (k, KeyOp::Remember(ttl)))
                    .collect()
            }
            3 if self.rng.below(3) == 0 => vec![(key, KeyOp::Forget)],
            4 | 5 if caps.claim => {
                let lease = self.lease();
                self.keys()
                    .into_iter()
                    .map(|k| (k, KeyOp::Claim(lease)))
                    .collect()
            }
            6 if caps.claim => vec![(key, KeyOp::Release(self.token(key)))],
            7 if caps.lease => {
                let lease = self.lease();
                vec![(key, KeyOp::Renew(self.token(key), lease))]
            }
            8 | 9 if caps.lease => {
                let ttl = self.ttl();
                vec![(key, KeyOp::Commit(self.token(key), ttl))]
            }
            10 if self.transact.is_some() => {
                let ttl = self.ttl();
                vec![(key, KeyOp::Transact(ttl, self.rng.below(4) != 0))]
            }
            _ => vec![(key, KeyOp::Seen)],
        };
        self.call(parts)
    }

    /// Makes the call, and records each key's part of it.
    fn call(&mut self, parts: Vec<(usize, KeyOp)>) -> Result<(), String> {
        let invoked = self.order.fetch_add(1, Ordering::SeqCst);
        let lo = (self.now_ms)().saturating_sub(self.slack);
        let (reply, swallowed) = self.make(&parts);
        let hi = (self.now_ms)() + self.slack;
        let completed = self.order.fetch_add(1, Ordering::SeqCst);
        let check = |answers: &Vec<KeyAnswer>| {
            if answers.len() == parts.len() {
                Ok(())
            } else {
                Err(format!(
                    "{} answers for {} keys: {answers:?}",
                    answers.len(),
                    parts.len()
                ))
            }
        };
        // What to record: the answers (`None`: unknown), completion and end.
        let mut outcomes: Vec<(Option<Vec<KeyAnswer>>, u64, u64)> = Vec::new();
        // A reply a fault kept from the caller: the call took effect, known.
        match swallowed {
            Some(Ok(answers)) => {
                check(&answers)?;
                outcomes.push((Some(answers), completed, hi));
            }
            Some(Err(_)) => outcomes.push((None, u64::MAX, u64::MAX)),
            None => {}
        }
        match reply {
            Ok(answers) => {
                check(&answers)?;
                for ((key, _), answer) in parts.iter().zip(&answers) {
                    if let KeyAnswer::Claim(_, Some(token)) = answer {
                        self.tokens[*key].push(token.clone());
                    }
                }
                outcomes.push((Some(answers), completed, hi));
            }
            // A call the test broke in the middle: unknown, as a backend error.
            Err(e) if e.message.starts_with(super::fault::OUTCOME_UNKNOWN) => {
                outcomes.push((None, u64::MAX, u64::MAX))
            }
            // An injected fault: before, nothing happened; after, its swallowed
            // reply is recorded above.
            Err(e) if e.message.starts_with("injected fault") => {}
            // The backend's own error, where the test causes them: unknown,
            // it may take effect at any later instant. Otherwise a failure.
            Err(_) if self.backend_errors => outcomes.push((None, u64::MAX, u64::MAX)),
            Err(e) => {
                let keys: Vec<String> = parts.iter().map(|(k, _)| shown(&KEYS[*k])).collect();
                return Err(format!(
                    "client {}: the store failed, with no fault injected: {e} (keys {keys:?}, \
                     {:?})",
                    self.id, parts[0].1
                ));
            }
        }
        for (answers, completed, hi) in outcomes {
            for (n, (key, op)) in parts.iter().enumerate() {
                self.calls.push((
                    *key,
                    KeyCall {
                        client: self.id,
                        op: op.clone(),
                        answer: answers.as_ref().map(|a| a[n].clone()),
                        invoked,
                        completed,
                        window: (lo, hi),
                    },
                ));
            }
        }
        Ok(())
    }

    /// The store call for `parts` (they are all of one kind), split per key;
    /// and the reply a fault swallowed, if one did.
    #[allow(clippy::type_complexity)]
    fn make(
        &self,
        parts: &[(usize, KeyOp)],
    ) -> (
        StoreResult<Vec<KeyAnswer>>,
        Option<StoreResult<Vec<KeyAnswer>>>,
    ) {
        let keys: Vec<&str> = parts.iter().map(|(k, _)| KEYS[*k].as_str()).collect();
        let ms = Duration::from_millis;
        let store = &self.store;
        fn wait<T>(f: impl Future<Output = StoreResult<T>>) -> StoreResult<T> {
            block_on_ready(f).unwrap_or_else(|_| {
                Err(crate::StoreError::internal(
                    "the store did not complete synchronously",
                ))
            })
        }
        let n = keys.len();
        macro_rules! split {
            ($call:expr, $ty:ty, $f:expr) => {{
                let f = $f;
                let reply = wait($call).map(f);
                let swallowed = store.take_swallowed::<StoreResult<$ty>>().map(|r| r.map(f));
                (reply, swallowed)
            }};
        }
        let done = move |()| vec![KeyAnswer::Done; n];
        let bools = |v: Vec<bool>| v.into_iter().map(KeyAnswer::Bool).collect::<Vec<_>>();
        let claims = |v: Vec<Claim>| v.into_iter().map(KeyAnswer::from).collect::<Vec<_>>();
        let peeks = |v: Vec<Peeked>| v.into_iter().map(KeyAnswer::Peek).collect::<Vec<_>>();
        match &parts[0].1 {
            KeyOp::Seen => split!(store.seen_many(&keys), Vec<bool>, bools),
            KeyOp::Peek => split!(store.peek_many(&keys), Vec<Peeked>, peeks),
            KeyOp::Remember(ttl) => {
                split!(store.remember_many(&keys, ttl.map(ms)), (), done)
            }
            KeyOp::Forget => split!(store.forget(keys[0]), (), done),
            KeyOp::Claim(lease) => split!(store.claim_many(&keys, ms(*lease)), Vec<Claim>, claims),
            KeyOp::Release(token) => split!(store.release(keys[0], token), (), done),
            KeyOp::Renew(token, lease) => {
                split!(store.renew(keys[0], token, ms(*lease)), bool, |b| vec![
                    KeyAnswer::Bool(b)
                ])
            }
            // Half the commits go as a settlement, as the guard sends them.
            KeyOp::Commit(token, ttl) if token.0.len() % 2 == 0 => {
                split!(
                    store.remember_fenced(keys[0], token, ttl.map(ms)),
                    bool,
                    |b| vec![KeyAnswer::Bool(b)]
                )
            }
            KeyOp::Commit(token, ttl) => {
                let remember = [(keys[0], Some(token))];
                let step = Settlement {
                    remember: &remember,
                    ttl: ttl.map(ms),
                    ..Settlement::default()
                };
                split!(store.settle(&step), Settled, |s: Settled| vec![
                    KeyAnswer::Bool(s.kept.first().copied().unwrap_or(false))
                ])
            }
            KeyOp::Transact(ttl, ok) => {
                let transact = self.transact.as_ref().expect("a transactional fleet");
                let reply = transact(store.inner(), keys[0], ttl.map(ms), *ok)
                    .map(|run| vec![KeyAnswer::Tx(run)]);
                (reply, None)
            }
        }
    }
}
