//! What a consumer pays per message in store round trips, and what that
//! makes of its throughput at a network's latency: our guard (seen-set,
//! claiming, transactional; `process` for one delivery, `process_batch` for
//! 10 and 100) and the peers' patterns (peers.rs), on Redis and PostgreSQL,
//! each through a relay (relay.rs) that counts round trips and adds a one-way
//! delay (calibrated to the round trips asked for). Per delivery it reports round trips (the relay's count), the
//! server's own count of what it ran (Redis `INFO commandstats` calls,
//! PostgreSQL `pg_stat_statements` calls), and deliveries per second, for
//! fresh ids whose handler succeeds (`new`), the same ids again
//! (`duplicate`), and fresh ids whose handler fails (`failed`). Handlers do no
//! I/O of their own. It measures; it asserts only that each consumer did what
//! its case means (ran each new id once, skipped each duplicate). The
//! consumers take turns, in rounds (see [`Bench::measure`]).
//!
//! `make bench-net` runs it with the servers in a network namespace of their
//! own (bench/net.sh); alone, on any servers:
//!
//! ```text
//! BQ_BENCH_RTT_US=0,500 taskset -c 1 scripts/with-stores.sh taskset -c 0 \
//!   cargo bench -p babelqueue-dedupe-stores --bench round_trips
//! ```
//!
//! (the servers on one core, the bench on another, as bench/net.sh runs them:
//! else which connections share a core with their server process is chance).
//!
//! `BQ_BENCH_STATEMENT_CACHE=off|generic` runs our PostgreSQL store with that
//! `statement_cache` (off: every statement parsed and planned per call; generic:
//! prepared and planned once per connection). `BQ_BENCH_DIRECT=1` connects every
//! client straight to the servers, without the relay (round trips then read 0).
//! `BQ_BENCH_STORES=postgres` (or `redis`) runs one store's consumers only.

mod peers;
mod relay;

use std::fmt::Write as _;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

use bq_dedupe::{Guard, OutcomeKind, block_on_ready};
use bq_dedupe_stores::{PostgresStore, RedisStore};
use peers::{Handler, Peer};
use relay::Relay;

const BATCHES: [usize; 3] = [1, 10, 100];
const CASES: [&str; 3] = ["new", "duplicate", "failed"];
/// Rounds of interleaved measurement (see [`Bench::measure`]).
const ROUNDS: usize = 10;

fn envelope(id: &str) -> String {
    format!(
        r#"{{"job":"urn:babel:orders:created","trace_id":"7b3f9c2a-e41d-4f88-9b2a-1c0d5e6f7a8b","data":{{"order_id":1042}},"meta":{{"id":"{id}","queue":"orders","schema_version":1}},"attempts":0}}"#
    )
}

fn ready<F: Future>(f: F) -> F::Output {
    block_on_ready(f).expect("store futures complete at once")
}

/// One consumer under test: runs `ids` in batches of `batch`, answers how
/// many handlers ran.
trait Subject {
    fn run(&mut self, ids: &[String], batch: usize, handler: Handler) -> usize;
    /// A peer never batches: its batch is its messages one at a time.
    fn batches(&self) -> bool {
        true
    }
}

fn handler_result(handler: Handler) -> Result<(), ()> {
    match handler {
        Handler::Ok => Ok(()),
        Handler::Fails => Err(()),
    }
}

fn ran(kind: OutcomeKind) -> bool {
    matches!(
        kind,
        OutcomeKind::Ran | OutcomeKind::Failed | OutcomeKind::RanUnrecorded
    )
}

/// Our guard over any store, in the plain or claiming mode.
struct Ours<S: bq_dedupe::Store>(Guard<S>);

impl<S: bq_dedupe::Store> Subject for Ours<S> {
    fn run(&mut self, ids: &[String], batch: usize, handler: Handler) -> usize {
        let bodies: Vec<String> = ids.iter().map(|id| envelope(id)).collect();
        let work = async |_: &bq_dedupe::Message<'_>| handler_result(handler);
        let mut count = 0;
        for chunk in bodies.chunks(batch) {
            if batch == 1 {
                count += usize::from(ran(ready(self.0.process(&chunk[0], work)).kind()));
            } else {
                let outcomes = ready(self.0.process_batch(chunk, work));
                count += outcomes.iter().filter(|o| ran(o.kind())).count();
            }
        }
        count
    }
}

/// Our exactly-once mode on PostgreSQL: the id and the handler's transaction.
struct Transactional(Guard<PostgresStore>);

impl Subject for Transactional {
    fn run(&mut self, ids: &[String], batch: usize, handler: Handler) -> usize {
        let bodies: Vec<String> = ids.iter().map(|id| envelope(id)).collect();
        let mut count = 0;
        for chunk in bodies.chunks(batch) {
            let kinds: Vec<OutcomeKind> = if batch == 1 {
                vec![
                    self.0
                        .process_in_transaction(&chunk[0], |_, _| handler_result(handler))
                        .kind(),
                ]
            } else {
                self.0
                    .process_batch_in_transaction(chunk, |_, _| handler_result(handler))
                    .iter()
                    .map(|o| o.kind())
                    .collect()
            };
            count += kinds.into_iter().filter(|k| ran(*k)).count();
        }
        count
    }
}

struct PeerSubject(Box<dyn Peer>);

impl Subject for PeerSubject {
    fn run(&mut self, ids: &[String], _: usize, handler: Handler) -> usize {
        ids.iter().filter(|id| self.0.deliver(id, handler)).count()
    }
    fn batches(&self) -> bool {
        false
    }
}

/// `host:port` of a `scheme://[user@]host:port/...` URL.
fn server_addr(url: &str) -> SocketAddr {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    let host_port = rest.split(['/', '?']).next().unwrap();
    host_port
        .to_socket_addrs()
        .unwrap_or_else(|e| panic!("{host_port}: {e}"))
        .next()
        .unwrap()
}

/// The URL with its host and port replaced by the relay's.
fn via(url: &str, relay: &Relay) -> String {
    let (scheme, rest) = url.split_once("://").unwrap();
    let (user, rest) = match rest.rsplit_once('@') {
        Some((user, rest)) => (format!("{user}@"), rest),
        None => (String::new(), rest),
    };
    let tail = rest.find(['/', '?']).map_or("", |i| &rest[i..]);
    format!("{scheme}://{user}{}{tail}", relay.addr)
}

/// The server's own count of what it ran.
trait ServerCount {
    fn count(&mut self) -> u64;
}

struct RedisCommands(redis::Connection);

impl ServerCount for RedisCommands {
    fn count(&mut self) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut self.0)
            .unwrap();
        // `cmdstat_<name>:calls=N,...`, minus the INFO calls that read it.
        let mut total = 0;
        let mut info_calls = 0;
        for line in info.lines().filter(|l| l.starts_with("cmdstat_")) {
            let calls: u64 = line
                .split_once("calls=")
                .and_then(|(_, r)| r.split(',').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            total += calls;
            if line.starts_with("cmdstat_info:") {
                info_calls = calls;
            }
        }
        total - info_calls
    }
}

struct PgStatements(postgres::Client);

impl ServerCount for PgStatements {
    fn count(&mut self) -> u64 {
        let row = self
            .0
            .query_one(
                "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements
                 WHERE query NOT ILIKE '%pg_stat_statements%'",
                &[],
            )
            .unwrap();
        row.get::<_, i64>(0) as u64
    }
}

/// One measured row.
struct Row {
    store: &'static str,
    consumer: String,
    batch: usize,
    case: &'static str,
    rtt_us: u64,
    round_trips: f64,
    server_ops: f64,
    per_second: f64,
}

struct Bench {
    run_id: String,
    next: u64,
    rows: Vec<Row>,
    deliveries: usize,
}

impl Bench {
    fn fresh_ids(&mut self, n: usize) -> Vec<String> {
        self.next += 1;
        (0..n)
            .map(|i| format!("rt-{}-{}-{i}", self.run_id, self.next))
            .collect()
    }

    /// Every subject at every batch size and case, interleaved: `ROUNDS`
    /// rounds, each giving every subject an equal share of the deliveries
    /// (the order rotating from round to round), so that each sees the same
    /// mix of the machine's states. On a 2-core machine a client and its
    /// server answer each other in about 15 µs while the scheduler keeps them
    /// on one core and 70 µs once it splits them, and it flips between the two
    /// for seconds at a time: consumers measured one after the other differed
    /// by 5x with the same code.
    fn measure(
        &mut self,
        store: &'static str,
        subjects: &mut [(&str, Box<dyn Subject>)],
        relay: &Relay,
        server: &mut dyn ServerCount,
        rtt_us: u64,
    ) {
        #[derive(Clone, Copy, Default)]
        struct Total {
            elapsed: Duration,
            round_trips: u64,
            server_ops: u64,
            ran: usize,
        }
        let mut rows = Vec::new();
        for batch in BATCHES {
            let who: Vec<usize> = (0..subjects.len())
                .filter(|&s| batch == 1 || subjects[s].1.batches())
                .collect();
            // At a long delay, fewer single deliveries (each is round trips long).
            let n = if batch == 1 && rtt_us > 0 {
                self.deliveries.min(500)
            } else {
                self.deliveries
            };
            // Each round's share a whole number of batches.
            let share = (n / ROUNDS).div_ceil(batch).max(1) * batch;
            let mut totals = vec![[Total::default(); CASES.len()]; subjects.len()];
            for round in 0..ROUNDS {
                for turn in 0..who.len() {
                    let s = who[(round + turn) % who.len()];
                    let new = self.fresh_ids(share);
                    let failed = self.fresh_ids(share);
                    for (c, case) in CASES.iter().enumerate() {
                        let (ids, handler) = match *case {
                            "new" | "duplicate" => (&new, Handler::Ok),
                            _ => (&failed, Handler::Fails),
                        };
                        let (rt0, ops0) = (relay.round_trips(), server.count());
                        let start = Instant::now();
                        let ran = subjects[s].1.run(ids, batch, handler);
                        let elapsed = start.elapsed();
                        let (rt1, ops1) = (relay.round_trips(), server.count());
                        let total = &mut totals[s][c];
                        total.elapsed += elapsed;
                        total.round_trips += rt1 - rt0;
                        total.server_ops += ops1.saturating_sub(ops0);
                        total.ran += ran;
                    }
                }
            }
            let n = share * ROUNDS;
            for &s in &who {
                for (c, case) in CASES.iter().enumerate() {
                    let total = totals[s][c];
                    let expect = if *case == "duplicate" { 0 } else { n };
                    let consumer = subjects[s].0;
                    assert_eq!(
                        total.ran, expect,
                        "{store} {consumer} batch {batch} {case}: handlers run"
                    );
                    rows.push((
                        s,
                        Row {
                            store,
                            consumer: consumer.to_owned(),
                            batch,
                            case,
                            rtt_us,
                            round_trips: total.round_trips as f64 / n as f64,
                            server_ops: total.server_ops as f64 / n as f64,
                            per_second: n as f64 / total.elapsed.as_secs_f64(),
                        },
                    ));
                }
            }
        }
        // One consumer's rows together, as the tables list them.
        rows.sort_by_key(|(s, row)| (*s, row.batch));
        self.rows.extend(rows.into_iter().map(|(_, row)| row));
    }
}

/// The relay's own round trip, measured with Redis `PING`s (median of 200).
fn measured_rtt(relay: &Relay) -> Duration {
    let url = format!("redis://{}/", relay.addr);
    let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
    let mut times: Vec<Duration> = (0..200)
        .map(|_| {
            let start = Instant::now();
            let _: String = redis::cmd("PING").query(&mut conn).unwrap();
            start.elapsed()
        })
        .collect();
    times.sort();
    times[times.len() / 2]
}

/// Sets the relays' one-way delay so that a round trip through them takes
/// `target` (a sleep's overshoot taken off); answers the round trip measured.
fn calibrate(relays: &[&Relay], target: Duration) -> Duration {
    if target.is_zero() {
        return measured_rtt(relays[0]);
    }
    let mut one_way = target / 2;
    for _ in 0..3 {
        for relay in relays {
            relay.set_delay(one_way);
        }
        let measured = measured_rtt(relays[0]);
        let error = measured.as_secs_f64() - target.as_secs_f64();
        let next = (one_way.as_secs_f64() - error / 2.0).max(0.0);
        one_way = Duration::from_secs_f64(next);
    }
    for relay in relays {
        relay.set_delay(one_way);
    }
    measured_rtt(relays[0])
}

fn main() {
    // `cargo bench` passes `--bench`; nothing here takes arguments.
    let redis_url = std::env::var("BQ_TEST_REDIS_URL")
        .expect("BQ_TEST_REDIS_URL: run under scripts/with-stores.sh or bench/net.sh");
    let pg_url = std::env::var("BQ_TEST_POSTGRES_URL")
        .expect("BQ_TEST_POSTGRES_URL: run under scripts/with-stores.sh or bench/net.sh");
    let delays: Vec<u64> = std::env::var("BQ_BENCH_RTT_US")
        .unwrap_or_else(|_| "0".into())
        .split(',')
        .map(|d| {
            d.trim()
                .parse()
                .expect("BQ_BENCH_RTT_US: microseconds, comma-separated")
        })
        .collect();
    let deliveries = std::env::var("BQ_BENCH_DELIVERIES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1000);
    let mut bench = Bench {
        run_id: format!("{}", std::process::id()),
        next: 0,
        rows: Vec::new(),
        deliveries,
    };
    let mut pg_admin = postgres::Client::connect(&pg_url, postgres::NoTls).unwrap();
    pg_admin
        .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .expect("pg_stat_statements (the server must preload it)");
    let mut pg_count = PgStatements(pg_admin);
    let mut redis_count = RedisCommands(
        redis::Client::open(redis_url.as_str())
            .unwrap()
            .get_connection()
            .unwrap(),
    );
    let mut rtts = Vec::new();
    for &rtt_us in &delays {
        let target = Duration::from_micros(rtt_us);
        let redis_relay = Relay::start(server_addr(&redis_url), Duration::ZERO);
        let pg_relay = Relay::start(server_addr(&pg_url), Duration::ZERO);
        let rtt = calibrate(&[&redis_relay, &pg_relay], target);
        rtts.push((rtt_us, rtt));
        // BQ_BENCH_DIRECT=1: every client straight to the servers, no relay (its
        // round trips then read 0): what the clients cost without its hand-offs.
        let direct = std::env::var("BQ_BENCH_DIRECT").as_deref() == Ok("1");
        let (redis_via, pg_via) = match direct {
            true => (redis_url.clone(), pg_url.clone()),
            false => (via(&redis_url, &redis_relay), via(&pg_url, &pg_relay)),
        };
        // Plain TCP for every PostgreSQL client here, ours and the peers'.
        let pg_via = format!(
            "{pg_via}{}sslmode=disable",
            if pg_url.contains('?') { "&" } else { "?" }
        );
        let prefix = format!("bq-rt-{}-{rtt_us}:", bench.run_id);
        let redis_conn = || {
            redis::Client::open(redis_via.as_str())
                .unwrap()
                .get_connection()
                .unwrap()
        };
        let redis_store = || RedisStore::connect(&redis_via, prefix.clone()).unwrap();
        let mut redis_subjects: Vec<(&str, Box<dyn Subject>)> = vec![
            ("ours seen-set", Box::new(Ours(Guard::new(redis_store())))),
            (
                "ours claiming",
                Box::new(Ours(
                    Guard::new(redis_store()).with_claiming(Duration::from_secs(30)),
                )),
            ),
            (
                "Go Wrap",
                Box::new(PeerSubject(Box::new(peers::GoRedis(
                    redis_conn(),
                    format!("{prefix}go:"),
                )))),
            ),
            (
                "PHP claiming",
                Box::new(PeerSubject(Box::new(peers::PhpRedis(
                    redis_conn(),
                    format!("{prefix}php:"),
                )))),
            ),
            (
                "Powertools",
                Box::new(PeerSubject(Box::new(peers::PowertoolsRedis(
                    redis_conn(),
                    format!("{prefix}pt:"),
                )))),
            ),
        ];
        if !wanted("redis") {
            redis_subjects.clear();
        }
        bench.measure(
            "redis",
            &mut redis_subjects,
            &redis_relay,
            &mut redis_count,
            rtt_us,
        );
        let table = format!("bq_rt_{}_{rtt_us}", bench.run_id);
        let pg_client = || postgres::Client::connect(&pg_via, postgres::NoTls).unwrap();
        // BQ_BENCH_STATEMENT_CACHE=off|on|generic: our store's `statement_cache`
        // (pg_via has a query already: its sslmode).
        let store_url = match std::env::var("BQ_BENCH_STATEMENT_CACHE") {
            Ok(cache) => format!("{pg_via}&statement_cache={cache}"),
            Err(_) => pg_via.clone(),
        };
        let pg_store = |suffix: &str| {
            PostgresStore::connect(&store_url, &format!("{table}_{suffix}")).unwrap()
        };
        let mut setup = pg_client();
        peers::create_tables(&mut setup, &table);
        let mut pg_subjects: Vec<(&str, Box<dyn Subject>)> = vec![
            (
                "ours seen-set",
                Box::new(Ours(Guard::new(pg_store("seen")))),
            ),
            (
                "ours claiming",
                Box::new(Ours(
                    Guard::new(pg_store("claiming")).with_claiming(Duration::from_secs(30)),
                )),
            ),
            (
                "ours transactional",
                Box::new(Transactional(Guard::new(pg_store("tx")))),
            ),
            (
                "Go Wrap",
                Box::new(PeerSubject(Box::new(peers::GoPostgres::new(
                    pg_client(),
                    &format!("{table}_go"),
                )))),
            ),
            (
                "PHP claiming (PDO)",
                Box::new(PeerSubject(Box::new(peers::PhpPostgres::new(
                    pg_client(),
                    &format!("{table}_php"),
                )))),
            ),
            (
                "Powertools",
                Box::new(PeerSubject(Box::new(peers::PowertoolsPostgres::new(
                    pg_client(),
                    &format!("{table}_pt"),
                )))),
            ),
        ];
        if !wanted("postgres") {
            pg_subjects.clear();
        }
        bench.measure(
            "postgres",
            &mut pg_subjects,
            &pg_relay,
            &mut pg_count,
            rtt_us,
        );
        drop(pg_subjects);
        let mut clean = String::new();
        for suffix in [
            "go",
            "php",
            "pt",
            "seen",
            "seen_claims",
            "claiming",
            "claiming_claims",
            "tx",
            "tx_claims",
        ] {
            let _ = write!(clean, "DROP TABLE IF EXISTS {table}_{suffix};");
        }
        let _ = setup.batch_execute(&clean);
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{prefix}*"))
            .query(&mut redis_count.0)
            .unwrap_or_default();
        for chunk in keys.chunks(1000) {
            let _: Result<i64, _> = redis::cmd("DEL").arg(chunk).query(&mut redis_count.0);
        }
    }
    let report = render(&bench.rows, &delays, &rtts);
    println!("{report}");
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/bench");
    let _ = std::fs::create_dir_all(&out);
    std::fs::write(out.join("round_trips.md"), &report).unwrap();
    eprintln!("written to target/bench/round_trips.md");
}

/// `BQ_BENCH_STORES` (comma-separated: redis, postgres) names `store`, or is unset.
fn wanted(store: &str) -> bool {
    std::env::var("BQ_BENCH_STORES")
        .map_or(true, |stores| stores.split(',').any(|s| s.trim() == store))
}

/// Two tables: per delivery at no added delay, and throughput at each delay.
fn render(rows: &[Row], delays: &[u64], rtts: &[(u64, Duration)]) -> String {
    let mut out = String::new();
    let first = delays[0];
    let _ = writeln!(
        out,
        "Round trips (relay) and server operations (Redis commands / PostgreSQL statements) per delivery, new / duplicate / failed:\n"
    );
    let _ = writeln!(
        out,
        "| store | consumer | batch | round trips | server ops |"
    );
    let _ = writeln!(out, "|---|---|---:|---|---|");
    let cell = |r: &Row, case: &str, f: &dyn Fn(&Row) -> f64| -> String {
        rows.iter()
            .find(|x| {
                x.store == r.store
                    && x.consumer == r.consumer
                    && x.batch == r.batch
                    && x.rtt_us == r.rtt_us
                    && x.case == case
            })
            .map_or("-".into(), |x| format!("{:.2}", f(x)))
    };
    for r in rows.iter().filter(|r| r.rtt_us == first && r.case == "new") {
        let trips: Vec<String> = CASES
            .iter()
            .map(|c| cell(r, c, &|x| x.round_trips))
            .collect();
        let ops: Vec<String> = CASES
            .iter()
            .map(|c| cell(r, c, &|x| x.server_ops))
            .collect();
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} |",
            r.store,
            r.consumer,
            r.batch,
            trips.join(" / "),
            ops.join(" / ")
        );
    }
    let _ = writeln!(
        out,
        "\nDeliveries per second, one consumer, new / duplicate / failed, by the round trip set (and as measured through the relay: Redis `PING`, median):\n"
    );
    let heads: Vec<String> = rtts
        .iter()
        .map(|(d, rtt)| {
            format!(
                "{:.1} ms ({:.2} ms)",
                *d as f64 / 1e3,
                rtt.as_secs_f64() * 1e3
            )
        })
        .collect();
    let _ = writeln!(out, "| store | consumer | batch | {} |", heads.join(" | "));
    let _ = writeln!(out, "|---|---|---:|{}", "---|".repeat(rtts.len()));
    for r in rows.iter().filter(|r| r.rtt_us == first && r.case == "new") {
        let per_delay: Vec<String> = delays
            .iter()
            .map(|&d| {
                CASES
                    .iter()
                    .map(|case| {
                        rows.iter()
                            .find(|x| {
                                x.store == r.store
                                    && x.consumer == r.consumer
                                    && x.batch == r.batch
                                    && x.rtt_us == d
                                    && x.case == *case
                            })
                            .map_or("-".into(), |x| format!("{:.0}", x.per_second))
                    })
                    .collect::<Vec<_>>()
                    .join(" / ")
            })
            .collect();
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} |",
            r.store,
            r.consumer,
            r.batch,
            per_delay.join(" | ")
        );
    }
    out
}
