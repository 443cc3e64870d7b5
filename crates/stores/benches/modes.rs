//! What each mode costs per delivery on SQLite and PostgreSQL (docs/modes.md):
//! one delivery of a fresh id whose handler inserts one effect row, and one
//! redelivery of an id already done (skipped, nothing runs).
//!
//! - `seen_set`: `Guard::process`; the handler writes its row through its own
//!   connection, then the id is remembered (two transactions per delivery);
//! - `claiming`: `Guard::with_claiming(30 s)`: a claim, the handler's write, the
//!   settle (three);
//! - `transactional`: `Guard::process_in_transaction`: the handler's row and the
//!   id in one transaction (one).
//!
//! SQLite is a file in the temp directory (the store's defaults: WAL,
//! `synchronous=NORMAL`); PostgreSQL is `BQ_TEST_POSTGRES_URL` (`make bench`
//! runs it under scripts/with-postgres.sh: loopback, `fsync=off`, TLS offered
//! and taken: `prefer`). Group `modes/<backend>/<mode>/<fresh|redelivery>`.
//! Nothing here asserts anything about timings; a sanity check before timing
//! panics unless each mode wrote one effect row per fresh id.
//!
//! ```text
//! scripts/with-postgres.sh cargo bench -p babelqueue-dedupe-stores --bench modes
//! ```

use std::cell::RefCell;
use std::hint::black_box;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bq_dedupe::{Guard, OutcomeKind, block_on_ready};
use bq_dedupe_stores::{PostgresStore, SqliteStore};
use criterion::{Criterion, criterion_group, criterion_main};

fn envelope(id: &str) -> String {
    format!(
        r#"{{"job":"urn:babel:orders:created","trace_id":"7b3f9c2a-e41d-4f88-9b2a-1c0d5e6f7a8b","data":{{"order_id":1042}},"meta":{{"id":"{id}","queue":"orders","schema_version":1}},"attempts":0}}"#
    )
}

/// Fresh ids, unique across runs and modes.
fn fresh() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let run = std::process::id();
    format!("bench-{run}-{}", N.fetch_add(1, Ordering::Relaxed))
}

/// Every store here is synchronous: its futures are ready at once.
fn ready<F: Future>(f: F) -> F::Output {
    block_on_ready(f).expect("store futures complete at once")
}

const MODES: [&str; 3] = ["seen_set", "claiming", "transactional"];

/// One backend: a delivery through `mode`, its handler inserting `id`'s effect row.
trait Backend {
    fn name(&self) -> &'static str;
    fn deliver(&self, mode: &str, body: &str) -> OutcomeKind;
    fn effects(&self) -> i64;
}

struct Sqlite {
    path: PathBuf,
    plain: Guard<SqliteStore>,
    claiming: Guard<SqliteStore>,
    effects: RefCell<rusqlite::Connection>,
}

const SQLITE_EFFECT: &str = "INSERT INTO bench_effects (id) VALUES (?1)";

impl Sqlite {
    fn new() -> Sqlite {
        let path = std::env::temp_dir().join(format!("bq-bench-modes-{}.db", std::process::id()));
        let open = || SqliteStore::open(&path).expect("open the bench file");
        let plain = Guard::new(open());
        let claiming = Guard::new(open()).with_claiming(Duration::from_secs(30));
        let effects = rusqlite::Connection::open(&path).unwrap();
        effects
            .execute_batch(
                "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=5000;
                 CREATE TABLE IF NOT EXISTS bench_effects (id TEXT PRIMARY KEY)",
            )
            .unwrap();
        Sqlite {
            path,
            plain,
            claiming,
            effects: RefCell::new(effects),
        }
    }
}

impl Drop for Sqlite {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", self.path.display()));
        }
    }
}

impl Backend for Sqlite {
    fn name(&self) -> &'static str {
        "sqlite"
    }
    fn deliver(&self, mode: &str, body: &str) -> OutcomeKind {
        let effect = async |m: &bq_dedupe::Message<'_>| {
            let id = m.id().unwrap_or_default();
            self.effects.borrow().execute(SQLITE_EFFECT, [id]).map(drop)
        };
        match mode {
            "seen_set" => ready(self.plain.process(body, effect)).kind(),
            "claiming" => ready(self.claiming.process(body, effect)).kind(),
            _ => self
                .plain
                .process_in_transaction(body, |m, tx| {
                    tx.execute(SQLITE_EFFECT, [m.id().unwrap_or_default()])
                        .map(drop)
                })
                .kind(),
        }
    }
    fn effects(&self) -> i64 {
        let conn = self.effects.borrow();
        conn.query_row("SELECT count(*) FROM bench_effects", [], |r| r.get(0))
            .unwrap()
    }
}

struct Postgres {
    url: String,
    table: String,
    plain: Guard<PostgresStore>,
    claiming: Guard<PostgresStore>,
    effects: RefCell<postgres::Client>,
}

const PG_EFFECT: &str = "INSERT INTO bench_effects (id) VALUES ($1)";

impl Postgres {
    fn new(url: String) -> Postgres {
        let table = format!("bq_bench_modes_{}", std::process::id());
        let open = || PostgresStore::connect(&url, &table).expect("connect to PostgreSQL");
        let plain = Guard::new(open());
        let claiming = Guard::new(open()).with_claiming(Duration::from_secs(30));
        let mut effects = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        effects
            .batch_execute(
                "DROP TABLE IF EXISTS bench_effects; CREATE TABLE bench_effects (id TEXT PRIMARY KEY)",
            )
            .unwrap();
        Postgres {
            url,
            table,
            plain,
            claiming,
            effects: RefCell::new(effects),
        }
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if let Ok(mut c) = postgres::Client::connect(&self.url, postgres::NoTls) {
            let t = &self.table;
            let _ = c.batch_execute(&format!(
                "DROP TABLE IF EXISTS {t}; DROP TABLE IF EXISTS {t}_claims; DROP TABLE IF EXISTS bench_effects"
            ));
        }
    }
}

impl Backend for Postgres {
    fn name(&self) -> &'static str {
        "postgres"
    }
    fn deliver(&self, mode: &str, body: &str) -> OutcomeKind {
        let effect = async |m: &bq_dedupe::Message<'_>| {
            let id = m.id().unwrap_or_default();
            self.effects
                .borrow_mut()
                .execute(PG_EFFECT, &[&id])
                .map(drop)
        };
        match mode {
            "seen_set" => ready(self.plain.process(body, effect)).kind(),
            "claiming" => ready(self.claiming.process(body, effect)).kind(),
            _ => self
                .plain
                .process_in_transaction(body, |m, tx| {
                    tx.execute(PG_EFFECT, &[&m.id().unwrap_or_default()])
                        .map(drop)
                })
                .kind(),
        }
    }
    fn effects(&self) -> i64 {
        self.effects
            .borrow_mut()
            .query_one("SELECT count(*) FROM bench_effects", &[])
            .unwrap()
            .get(0)
    }
}

/// Before timing: every mode runs a fresh id once (one more effect row) and
/// skips it when redelivered.
fn sanity(backend: &dyn Backend) {
    for mode in MODES {
        let before = backend.effects();
        let body = envelope(&fresh());
        assert_eq!(backend.deliver(mode, &body), OutcomeKind::Ran, "{mode}");
        assert_eq!(backend.deliver(mode, &body), OutcomeKind::Skipped, "{mode}");
        assert_eq!(backend.effects(), before + 1, "{mode}: one effect row");
    }
}

fn bench_backend(c: &mut Criterion, backend: &dyn Backend) {
    sanity(backend);
    let mut group = c.benchmark_group(format!("modes/{}", backend.name()));
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(3));
    for mode in MODES {
        // Bodies made outside the timed loop: only the delivery is measured.
        group.bench_function(format!("{mode}/fresh"), |b| {
            b.iter_custom(|iters| {
                let bodies: Vec<String> = (0..iters).map(|_| envelope(&fresh())).collect();
                let start = Instant::now();
                for body in &bodies {
                    black_box(backend.deliver(mode, body));
                }
                start.elapsed()
            });
        });
        let done = envelope(&fresh());
        backend.deliver(mode, &done);
        group.bench_function(format!("{mode}/redelivery"), |b| {
            b.iter(|| black_box(backend.deliver(mode, &done)));
        });
    }
    group.finish();
}

fn modes(c: &mut Criterion) {
    bench_backend(c, &Sqlite::new());
    match std::env::var("BQ_TEST_POSTGRES_URL") {
        Ok(url) if !url.is_empty() => bench_backend(c, &Postgres::new(url)),
        _ => panic!(
            "BQ_TEST_POSTGRES_URL is not set: run under scripts/with-postgres.sh (make bench does)"
        ),
    }
}

criterion_group!(benches, modes);
criterion_main!(benches);
