//! The guard in the loop: several consumers take deliveries from one shared
//! inbox (30 ids, some delivered up to three times), run [`Guard`], and
//! redeliver whatever the outcome says to retry, until the inbox is empty.
//! Handlers log every run outside the store; some fail, some panic, some run
//! past their lease, some die after their effect and before the commit. Checked
//! after a fleet's run ([`Inbox::check`]):
//! - nothing lost: every id was acked, and acked only after a handler of it
//!   succeeded;
//! - outside the seen-set mode, at most one plain `run-ok` per id: every
//!   successful run beyond the first was reported (`run-ok-lease-lost`,
//!   `run-ok-unrecorded`), or followed a consumer's death after its effect
//!   (the window docs/modes.md names: a crash between the effect and the
//!   commit runs once more), allowed once per death;
//! - where the mode commits effects in the store's transaction, exactly one
//!   committed effect per id.
//!
//! Consumers are futures: [`check_claiming_fleet`] runs them on threads; a
//! runner without threads joins [`Inbox::consume`]s on its event loop.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use bq_dedupe::{
    Disposition, Guard, Observer, OutcomeKind, Store, block_on_ready, guard::Verdict, lease::Timer,
};

/// How many ids the inbox holds.
pub const IDS: usize = 30;

/// What a handler does with one delivery (decided by the id and the attempt, so
/// every mode meets the same mix).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Act {
    /// Succeeds.
    Succeed,
    /// Returns an error.
    Fail,
    /// Panics (where a panic can be caught; a `Fail` elsewhere).
    Panic,
    /// Sleeps past the claim's lease, then succeeds.
    Slow,
    /// Transactional: a failed statement, ignored, then `Ok`.
    Swallow,
    /// The consumer dies after the handler's effect, before the commit.
    Die,
}

/// One delivery's record: the id's index, whether its handler (or transaction)
/// did its effect, and the outcome (`None`: the consumer died first).
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The id's index in [`Inbox::ids`].
    pub id: usize,
    /// Whether the handler's effect happened.
    pub effect: bool,
    /// The outcome; `None`: the consumer died before it.
    pub kind: Option<OutcomeKind>,
}

/// The shared inbox of a fleet's run, and the log of every delivery made.
#[derive(Debug)]
pub struct Inbox {
    ids: Vec<String>,
    /// (id, attempt, when it may be delivered, in ms of `now_ms`).
    queue: Mutex<VecDeque<(usize, u32, u64)>>,
    now_ms: fn() -> u64,
    log: Mutex<Vec<Delivery>>,
    panics: bool,
    lease: Duration,
}

impl Inbox {
    /// [`IDS`] ids `{prefix}-0` ... (the prefix must be new to the store),
    /// id `i` delivered `1 + i % 3` times; `lease`: the consumers' claim lease
    /// (a queue's visibility timeout is taken as that long). Time is the
    /// system's; [`Inbox::with_clock`] gives another.
    pub fn new(prefix: &str, lease: Duration) -> Self {
        let mut queue = VecDeque::new();
        for copies in 1..=3 {
            for id in 0..IDS {
                if id % 3 < copies {
                    queue.push_back((id, 0, 0));
                }
            }
        }
        Inbox {
            ids: (0..IDS).map(|i| format!("{prefix}-{i}")).collect(),
            queue: Mutex::new(queue),
            now_ms: || {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64)
            },
            log: Mutex::new(Vec::new()),
            panics: true,
            lease,
        }
    }

    /// Reads time from `now_ms` (where the system's clock cannot be read, as
    /// on wasm32 without WASI).
    pub fn with_clock(mut self, now_ms: fn() -> u64) -> Self {
        self.now_ms = now_ms;
        self
    }

    /// Handlers never panic (where a panic aborts, as on wasm32): those
    /// deliveries fail instead.
    pub fn without_panics(mut self) -> Self {
        self.panics = false;
        self
    }

    /// The ids.
    pub fn ids(&self) -> &[String] {
        &self.ids
    }

    /// Every delivery made so far.
    pub fn log(&self) -> Vec<Delivery> {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// What the handler does with `id`'s `attempt`th delivery.
    pub fn act(&self, id: usize, attempt: u32) -> Act {
        if attempt >= 3 {
            return Act::Succeed; // every id gets through in the end
        }
        match (id * 7 + attempt as usize * 13) % 10 {
            0 | 1 => Act::Fail,
            2 if self.panics => Act::Panic,
            2 => Act::Fail,
            3 => Act::Slow,
            4 => Act::Swallow,
            5 => Act::Die,
            _ => Act::Succeed,
        }
    }

    /// The first delivery that is due; `Err` when none is due but some wait.
    fn take(&self) -> Result<Option<(usize, u32)>, ()> {
        let now = (self.now_ms)();
        let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        match queue.iter().position(|&(_, _, due)| due <= now) {
            Some(i) => Ok(queue.remove(i).map(|(id, attempt, _)| (id, attempt))),
            None if queue.is_empty() => Ok(None),
            None => Err(()),
        }
    }

    /// Redelivers `id` after `delay`, as a queue does: the consumer goes on
    /// with other deliveries meanwhile.
    fn put_back(&self, id: usize, attempt: u32, delay: Duration) {
        let due = (self.now_ms)() + delay.as_millis() as u64;
        let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        queue.push_back((id, attempt, due));
    }

    /// One consumer's loop: takes deliveries until the inbox has stayed empty
    /// for 40 pauses of 20 ms. `deliver(id, act)` processes one delivery and
    /// answers (did the effect happen, the outcome); `sleep` waits. A
    /// redelivery waits in the inbox, not in the consumer, which goes on.
    pub async fn consume(
        &self,
        deliver: impl AsyncFn(&str, Act) -> (bool, Option<OutcomeKind>),
        sleep: impl AsyncFn(Duration),
    ) -> Result<(), String> {
        let mut idle = 0;
        while idle < 40 {
            let (id, attempt) = match self.take() {
                Ok(Some(next)) => next,
                // Others may still put retries back.
                Ok(None) => {
                    idle += 1;
                    sleep(Duration::from_millis(20)).await;
                    continue;
                }
                // A redelivery is not due yet.
                Err(()) => {
                    idle = 0;
                    sleep(Duration::from_millis(5)).await;
                    continue;
                }
            };
            idle = 0;
            let (effect, kind) = deliver(&self.ids[id], self.act(id, attempt)).await;
            self.log
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(Delivery { id, effect, kind });
            let Some(kind) = kind else {
                // Died: redelivered once the queue's visibility timeout (here,
                // the lease) has passed.
                self.put_back(id, attempt + 1, self.lease + Duration::from_millis(50));
                continue;
            };
            match kind.disposition() {
                Disposition::Ack => {}
                Disposition::Retry => {
                    let delay = match kind {
                        OutcomeKind::Parked => Duration::from_millis(30),
                        _ => Duration::ZERO,
                    };
                    self.put_back(id, attempt + 1, delay);
                }
                Disposition::Poison => {
                    return Err(format!("{kind:?} for {}, a valid envelope", self.ids[id]));
                }
            }
        }
        Ok(())
    }

    /// The invariants (see the module docs) for a fleet in `mode` ("seen-set"
    /// checks only that nothing was lost); `committed(id)`, where the mode
    /// commits effects in the store's transaction, counts the id's committed
    /// effect rows.
    pub fn check(&self, mode: &str, committed: Option<&dyn Fn(&str) -> i64>) -> Result<(), String> {
        let log = self.log();
        let mut by_id: HashMap<usize, Vec<&Delivery>> = HashMap::new();
        for d in &log {
            by_id.entry(d.id).or_default().push(d);
        }
        for (i, id) in self.ids.iter().enumerate() {
            let deliveries = by_id.get(&i).map(Vec::as_slice).unwrap_or(&[]);
            let count = |f: &dyn Fn(&Delivery) -> bool| deliveries.iter().filter(|d| f(d)).count();
            let acked = count(&|d| d.kind.map(|k| k.disposition()) == Some(Disposition::Ack));
            let effects = count(&|d| d.effect);
            let plain = count(&|d| d.effect && d.kind == Some(OutcomeKind::Ran));
            let reported = count(&|d| {
                d.effect
                    && matches!(
                        d.kind,
                        Some(OutcomeKind::RanLeaseLost | OutcomeKind::RanUnrecorded)
                    )
            });
            let died = count(&|d| d.effect && d.kind.is_none());
            let fail = |what: String| Err(format!("{mode}: {id} {what}: {deliveries:?}"));
            if acked == 0 {
                return fail("never acked".into());
            }
            if effects == 0 {
                return fail("acked, never run".into());
            }
            if mode != "seen-set" {
                if plain > 1 {
                    return fail(format!("ran {plain} times as plain run-ok"));
                }
                if effects > 1 + reported + died {
                    return fail(format!(
                        "ran {effects} times: {reported} reported, {died} died after theirs"
                    ));
                }
            }
            if let Some(rows) = committed.map(|c| c(id))
                && rows != 1
            {
                return fail(format!("left {rows} committed effects"));
            }
        }
        Ok(())
    }
}

/// The body of a delivery of `id` (a minimal valid envelope).
pub fn envelope(id: &str) -> String {
    let id = serde_json::to_string(id).unwrap_or_default();
    format!(
        r#"{{"job":"urn:babel:orders:created","trace_id":"7b3f9c2a-e41d-4f88-9b2a-1c0d5e6f7a8b","data":{{"order_id":1042}},"meta":{{"id":{id},"queue":"orders","schema_version":1}},"attempts":0}}"#
    )
}

/// A claiming or seen-set consumer's delivery: the handler's effect is its
/// successful run. `lease`: how long a slow handler outlives.
pub async fn plain_delivery<S: Store, O: Observer, T: Timer>(
    guard: &Guard<S, O, T>,
    id: &str,
    act: Act,
    lease: Duration,
    sleep: impl AsyncFn(Duration),
) -> (bool, Option<OutcomeKind>) {
    let body = envelope(id);
    if act == Act::Die {
        // Decided (claimed, in the claiming mode), the handler's effect done,
        // then the consumer is gone: nothing is committed or released.
        let decisions = guard.decide_batch(&[body.as_str()]).await;
        return (decisions[0].verdict == Verdict::Run, None);
    }
    let mut effect = false;
    let outcome = guard
        .process(body.as_str(), async |_| {
            match act {
                Act::Fail => return Err("declined".to_string()),
                Act::Panic => panic!("handler bug"),
                Act::Slow => sleep(lease + Duration::from_millis(100)).await,
                Act::Succeed | Act::Swallow => {}
                Act::Die => unreachable!("handled above"),
            }
            effect = true;
            Ok(())
        })
        .await;
    (effect, Some(outcome.kind()))
}

/// Runs `deliver(consumer, id, act)` on one thread per consumer until the
/// inbox is empty, each consumer's calls complete at once.
pub fn run_on_threads(
    inbox: &Inbox,
    consumers: usize,
    deliver: impl Fn(usize, &str, Act) -> (bool, Option<OutcomeKind>) + Sync,
) -> Result<(), String> {
    let sleep = async |d: Duration| std::thread::sleep(d);
    std::thread::scope(|scope| {
        let threads: Vec<_> = (0..consumers)
            .map(|c| {
                let deliver = &deliver;
                scope.spawn(move || {
                    block_on_ready(inbox.consume(async |id, act| deliver(c, id, act), sleep))
                        .unwrap_or_else(|_| Err("a consumer did not complete at once".into()))
                })
            })
            .collect();
        threads.into_iter().try_for_each(|t| {
            t.join()
                .unwrap_or_else(|_| Err("a consumer panicked".into()))
        })
    })
}

/// A fleet of claiming consumers (one per store in `stores`, each its own
/// client of one backend) with leases of `lease`, its invariants checked;
/// panics with what broke.
pub fn check_claiming_fleet<S: Store + Sync>(
    mode: &str,
    prefix: &str,
    stores: &[S],
    lease: Duration,
) {
    let guards: Vec<Guard<&S>> = stores
        .iter()
        .map(|s| Guard::new(s).with_claiming(lease))
        .collect();
    let inbox = Inbox::new(prefix, lease);
    let sleep = async |d: Duration| std::thread::sleep(d);
    run_on_threads(&inbox, guards.len(), |c, id, act| {
        block_on_ready(plain_delivery(&guards[c], id, act, lease, sleep))
            .expect("a store that completes at once")
    })
    .and_then(|()| inbox.check(mode, None))
    .unwrap_or_else(|e| panic!("the guard in the loop: {e}"));
}
