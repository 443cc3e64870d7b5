//! Shared by the store tests: temp SQLite files, the Redis location, envelopes, and
//! the semantics every store must have.

#![allow(dead_code)]
// `true` / `false` spelled out: which way a lease went is the point of each check.
#![allow(clippy::bool_assert_comparison)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bq_dedupe::{
    Guard, Outcome, Store, block_on_ready, store::Claim, store::ClaimToken, store::Settlement,
};

/// Drives a ready future (every store here is synchronous).
pub fn ready<F: Future>(f: F) -> F::Output {
    block_on_ready(f).expect("store futures complete at once")
}

/// Unique per process and call, so reruns never meet an earlier run's data.
pub fn unique(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let n = N.fetch_add(1, Ordering::Relaxed);
    format!("{tag}-{}-{nanos:x}-{n}", std::process::id())
}

/// A fresh path under `target/` (a SQLite file, or a file store's folder),
/// deleted on drop with everything beside it whose name begins with its own
/// (SQLite's `-wal` and `-shm`).
pub struct TempDb(pub PathBuf);

impl TempDb {
    pub fn new(tag: &str) -> Self {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bq-dedupe-stores");
        TempDb(dir.join(format!("{}.db", unique(tag))))
    }
    pub fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDb {
    fn drop(&mut self) {
        let (Some(dir), Some(name)) = (self.0.parent(), self.0.file_name()) else {
            return;
        };
        let name = name.to_string_lossy().into_owned();
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if entry.file_name().to_string_lossy().starts_with(&name) {
                let path = entry.path();
                let _ = std::fs::remove_file(&path).or_else(|_| std::fs::remove_dir_all(&path));
            }
        }
    }
}

/// The test Redis's spec (`redis` row of the table); unset, the test fails.
pub fn redis_url() -> String {
    server_spec(server_of("redis", false))
}

/// A Redis key prefix no other test or run uses.
pub fn redis_prefix(tag: &str) -> String {
    format!("bq-test:{}:", unique(tag))
}

/// Deletes every key under a prefix on drop, so a long-lived server stays clean.
pub struct RedisCleanup {
    pub url: String,
    pub prefix: String,
}

#[cfg(feature = "redis")]
impl Drop for RedisCleanup {
    fn drop(&mut self) {
        let Ok(mut conn) = redis::Client::open(self.url.as_str()).and_then(|c| c.get_connection())
        else {
            return;
        };
        let pattern = format!("{}*", self.prefix.replace('*', "\\*"));
        let keys: Vec<Vec<u8>> = redis::cmd("KEYS")
            .arg(&pattern)
            .query(&mut conn)
            .unwrap_or_default();
        for key in keys {
            let _: redis::RedisResult<()> = redis::cmd("DEL").arg(key).query(&mut conn);
        }
    }
}

/// A TCP proxy ([`lossy_proxy`]) and how many requests carrying its needle
/// passed through it.
pub struct LossyProxy {
    /// `HOST:PORT` to connect to instead of the server.
    pub address: String,
    pub sendings: std::sync::Arc<AtomicU64>,
}

/// A TCP proxy to `upstream` (`HOST:PORT`) that loses replies: while `drops` is
/// above zero, a reply to a request carrying `needle` (Redis `NX`: a claim;
/// PostgreSQL `COMMIT\0`, the query and its end) is not passed on; the client's connection is closed
/// instead, and `drops` goes down by one. The request itself reached the
/// server: a call that took effect, its reply lost. The bytes must be in the
/// clear (a PostgreSQL client with `sslmode=disable`). A needle the reply
/// repeats (PostgreSQL's command tag, `COMMIT\0`) marks the reply to lose: the
/// last bytes of an earlier reply, read once the request was seen, are not it
/// (under load that loss closed the connection before the server read the
/// request).
pub fn lossy_proxy(upstream: String, needle: &'static [u8], drops: usize) -> LossyProxy {
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpListener, TcpStream};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize};
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let drops = Arc::new(AtomicUsize::new(drops));
    let sendings = Arc::new(AtomicU64::new(0));
    let counted = sendings.clone();
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let server = TcpStream::connect(&upstream).unwrap();
            let claimed = Arc::new(AtomicBool::new(false));
            let (mut c_in, mut s_out) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            let (seen, counted) = (claimed.clone(), counted.clone());
            std::thread::spawn(move || {
                let mut buf = [0u8; 65536];
                while let Ok(n @ 1..) = c_in.read(&mut buf) {
                    // Marked before it goes out: its reply may come back first.
                    if contains(&buf[..n], needle) {
                        counted.fetch_add(1, Ordering::SeqCst);
                        seen.store(true, Ordering::SeqCst);
                    }
                    if s_out.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                let _ = s_out.shutdown(Shutdown::Both);
            });
            let (mut s_in, mut c_out) = (server, client);
            let drops = drops.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 65536];
                let echoed = needle == b"COMMIT\0";
                while let Ok(n @ 1..) = s_in.read(&mut buf) {
                    let lose = claimed.load(Ordering::SeqCst)
                        && (!echoed || contains(&buf[..n], needle))
                        && drops
                            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |d| d.checked_sub(1))
                            .is_ok();
                    if lose || c_out.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                let _ = c_out.shutdown(Shutdown::Both);
                let _ = s_in.shutdown(Shutdown::Both);
            });
        }
    });
    LossyProxy { address, sendings }
}

fn contains(bytes: &[u8], needle: &[u8]) -> bool {
    bytes.windows(needle.len()).any(|w| w == needle)
}

/// The test PostgreSQL's spec (`postgres` row); unset, the test fails.
pub fn postgres_url() -> String {
    server_spec(server_of("postgres", false))
}

/// A plain client of the test server (`BQ_TEST_POSTGRES_URL`), for a test's own
/// tables and counts.
#[cfg(feature = "postgres")]
pub fn pg() -> postgres::Client {
    postgres::Client::connect(&postgres_url(), postgres::NoTls).unwrap()
}

/// How many effect rows a test's handlers left for `id` in `TABLE_effects`.
#[cfg(feature = "postgres")]
pub fn pg_effects(table: &str, id: &str) -> i64 {
    pg().query_one(
        &format!("SELECT count(*) FROM {table}_effects WHERE id = $1"),
        &[&id],
    )
    .unwrap()
    .get(0)
}

/// The test cluster's `redis+cluster://` spec (`redis-cluster` row); unset,
/// the test fails.
pub fn redis_cluster_spec() -> String {
    server_spec(server_of("redis-cluster", false))
}

/// The `redis://HOST:PORT` of every node of a `redis+cluster://` spec.
pub fn cluster_nodes(spec: &str) -> Vec<String> {
    let hosts = spec
        .strip_prefix("redis+cluster://")
        .expect("a redis+cluster:// spec");
    let hosts = hosts.split(['/', '?']).next().unwrap_or_default();
    hosts.split(',').map(|h| format!("redis://{h}")).collect()
}

/// Deletes every key under a prefix on every node of a cluster, on drop.
pub struct ClusterCleanup {
    pub spec: String,
    pub prefix: String,
}

#[cfg(feature = "redis")]
impl Drop for ClusterCleanup {
    fn drop(&mut self) {
        for node in cluster_nodes(&self.spec) {
            drop(RedisCleanup {
                url: node,
                prefix: self.prefix.clone(),
            });
        }
    }
}

/// A PostgreSQL table name no other test or run uses (`unique`, made an identifier).
pub fn postgres_table(tag: &str) -> String {
    let raw = unique(tag);
    let mut t: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect();
    t.insert_str(0, "bqt_");
    t.truncate(56);
    t
}

/// Drops a test's tables (`T`, `T_claims` and its handlers' `T_effects`) on drop.
pub struct PgCleanup {
    pub url: String,
    pub table: String,
}

#[cfg(feature = "postgres")]
impl Drop for PgCleanup {
    fn drop(&mut self) {
        if let Ok(mut client) = postgres::Client::connect(&self.url, postgres::NoTls) {
            let _ = client.batch_execute(&format!(
                "DROP TABLE IF EXISTS {t}; DROP TABLE IF EXISTS {t}_claims; \
                 DROP TABLE IF EXISTS {t}_effects;",
                t = self.table
            ));
        }
    }
}

/// An envelope without an id (`fail-open`), told apart by its `trace_id`.
pub fn no_id_envelope(trace: &str) -> String {
    format!(
        r#"{{"job":"urn:babel:orders:created","trace_id":"{trace}","data":{{}},"meta":{{"schema_version":1}}}}"#
    )
}

/// A valid envelope whose `meta.id` is `id`.
pub fn envelope(id: &str) -> String {
    serde_json::json!({
        "job": "urn:babel:orders:created",
        "trace_id": "7b3f9c2a-e41d-4f88-9b2a-1c0d5e6f7a8b",
        "data": {"order_id": 1042},
        "meta": {"id": id, "queue": "orders", "schema_version": 1},
        "attempts": 0
    })
    .to_string()
}

/// Ids built to break a store that does not keep keys verbatim.
pub fn hostile_keys() -> Vec<String> {
    vec![
        "k".repeat(10 * 1024),
        "a\0b".into(),
        "\0".into(),
        "tab\tnewline\ncr\rbell\x07esc\x1b del\x7f".into(),
        "'); DROP TABLE bq_dedupe; --".into(),
        "\" OR 1=1; --".into(),
        // Against a statement that carries its values as escape strings.
        "\\'); DROP TABLE bq_dedupe; --".into(),
        "E'\\''\\".into(),
        "$1 $$ $q$ ]::text[]".into(),
        "*1\r\n$4\r\nPING\r\n".into(),
        "*3\r\n$3\r\nSET\r\n$1\r\nx\r\n$1\r\nd\r\n".into(),
        "ключ-键-🔑-\u{200b}-\u{fffd}".into(),
        "e\u{301}".into(), // decomposed é: not normalised to U+00E9
        "*".into(),
        "?[a-z]\\".into(),
        " ".into(),
    ]
}

/// Keys that differ from a hostile key only where a lossy store would merge them.
pub fn near_misses() -> Vec<String> {
    vec![
        "k".repeat(10 * 1024 - 1),
        "a".into(),
        "a\0c".into(),
        "".into(),
        "\u{e9}".into(),
        "x".into(),
        "  ".into(),
    ]
}

/// Every hostile key is remembered, found exactly, claimed and forgotten, and no
/// near miss is ever reported as seen; then each runs through a guard once.
pub fn check_hostile_keys<S: Store>(store: &S) {
    let keys = hostile_keys();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let claims = store.capabilities().claim;
    for key in &refs {
        assert!(!ready(store.seen(key)).unwrap(), "{key:?} seen before");
        if claims {
            assert!(matches!(
                ready(store.claim(key, Duration::from_secs(60))).unwrap(),
                Claim::Acquired(_)
            ));
        }
        ready(store.remember(key, None)).unwrap();
        assert!(ready(store.seen(key)).unwrap(), "{key:?} not found");
        if claims {
            assert_eq!(
                ready(store.claim(key, Duration::from_secs(60))).unwrap(),
                Claim::Seen
            );
        }
    }
    assert!(ready(store.seen_many(&refs)).unwrap().iter().all(|s| *s));
    let misses = near_misses();
    let miss_refs: Vec<&str> = misses.iter().map(String::as_str).collect();
    assert_eq!(
        ready(store.seen_many(&miss_refs)).unwrap(),
        vec![false; misses.len()],
        "a near miss matched a hostile key"
    );
    for key in &refs {
        ready(store.forget(key)).unwrap();
        assert!(!ready(store.seen(key)).unwrap(), "{key:?} survived forget");
    }

    let guard = Guard::new(store);
    for key in &refs {
        let body = envelope(key);
        let mut runs = 0;
        for _ in 0..2 {
            ready(guard.process(body.as_bytes(), async |msg| {
                assert_eq!(msg.id(), Some(*key), "the id reaches the handler verbatim");
                runs += 1;
                Ok::<(), String>(())
            }));
        }
        assert_eq!(runs, 1, "{key:?} ran twice");
        assert!(ready(store.seen(key)).unwrap());
    }
}

/// `seen` / `remember` / `forget`, and `remember` overwriting a TTL with none.
pub fn check_basics<S: Store>(store: &S) {
    assert!(!ready(store.seen("id-1")).unwrap());
    ready(store.remember("id-1", None)).unwrap();
    assert!(ready(store.seen("id-1")).unwrap());
    assert!(!ready(store.seen("id-2")).unwrap(), "one key, not all");
    ready(store.remember("id-1", None)).unwrap(); // idempotent
    ready(store.forget("id-1")).unwrap();
    assert!(!ready(store.seen("id-1")).unwrap());
    ready(store.forget("never-there")).unwrap();
}

/// A store that cannot claim says so, typed, for every claiming call.
fn check_refuses_claims<S: Store>(store: &S) {
    let lease = Duration::from_secs(60);
    let refused =
        |e: bq_dedupe::StoreError| e.kind == bq_dedupe::store::StoreErrorKind::Unsupported;
    assert!(ready(store.claim("c-1", lease)).is_err_and(refused));
    assert!(ready(store.claim_many(&["c-1", "c-2"], lease)).is_err_and(refused));
    let token = ClaimToken("t".into());
    assert!(ready(store.release("c-1", &token)).is_err_and(refused));
    assert!(ready(store.renew("c-1", &token, lease)).is_err_and(refused));
    assert!(
        !ready(store.seen("c-1")).unwrap(),
        "a refused claim left a record"
    );
}

/// Claims: Acquired, then Held for others; remember ends the claim (Seen after);
/// forget drops it. Where claims have owners (`renew`: PHP's format has none),
/// a wrong token releases nothing, the right one frees the key. A store that
/// cannot claim refuses every claiming call.
pub fn check_claims<S: Store>(store: &S) {
    let caps = store.capabilities();
    if !caps.claim {
        return check_refuses_claims(store);
    }
    let lease = Duration::from_secs(60);
    let Claim::Acquired(token) = ready(store.claim("c-1", lease)).unwrap() else {
        panic!("a free key must be acquired");
    };
    assert_eq!(ready(store.claim("c-1", lease)).unwrap(), Claim::Held);
    assert!(!ready(store.seen("c-1")).unwrap(), "a claim is not seen");
    if !caps.renew {
        return check_claims_without_owners(store, &token);
    }

    let wrong = ClaimToken(format!("{}x", token.0));
    ready(store.release("c-1", &wrong)).unwrap();
    assert_eq!(
        ready(store.claim("c-1", lease)).unwrap(),
        Claim::Held,
        "a wrong token released the claim"
    );
    ready(store.release("c-1", &ClaimToken(String::new()))).unwrap();
    assert_eq!(ready(store.claim("c-1", lease)).unwrap(), Claim::Held);

    ready(store.release("c-1", &token)).unwrap();
    let Claim::Acquired(second) = ready(store.claim("c-1", lease)).unwrap() else {
        panic!("a released key must be claimable");
    };
    assert_ne!(second, token, "tokens are never reused");
    // The first owner's stale token cannot release the second claim.
    ready(store.release("c-1", &token)).unwrap();
    assert_eq!(ready(store.claim("c-1", lease)).unwrap(), Claim::Held);

    ready(store.remember("c-1", None)).unwrap();
    assert!(ready(store.seen("c-1")).unwrap());
    assert_eq!(ready(store.claim("c-1", lease)).unwrap(), Claim::Seen);
    // Releasing after remembering leaves the id remembered.
    ready(store.release("c-1", &second)).unwrap();
    assert!(ready(store.seen("c-1")).unwrap());

    check_forget_drops_a_claim(store);
}

/// [`check_claims`] where any token releases a claim (the key is the owner).
fn check_claims_without_owners<S: Store>(store: &S, token: &ClaimToken) {
    let lease = Duration::from_secs(60);
    ready(store.release("c-1", token)).unwrap();
    let Claim::Acquired(second) = ready(store.claim("c-1", lease)).unwrap() else {
        panic!("a released key must be claimable");
    };
    ready(store.remember("c-1", None)).unwrap();
    assert_eq!(ready(store.claim("c-1", lease)).unwrap(), Claim::Seen);
    // Releasing after remembering leaves the id remembered.
    ready(store.release("c-1", &second)).unwrap();
    assert!(ready(store.seen("c-1")).unwrap());
    check_forget_drops_a_claim(store);
}

fn check_forget_drops_a_claim<S: Store>(store: &S) {
    let lease = Duration::from_secs(60);
    let Claim::Acquired(_) = ready(store.claim("c-2", lease)).unwrap() else {
        panic!("free key");
    };
    ready(store.forget("c-2")).unwrap();
    assert!(matches!(
        ready(store.claim("c-2", lease)).unwrap(),
        Claim::Acquired(_)
    ));
}

/// The batch forms agree with the single calls, answer in order, and cope with
/// empty input and repeated keys.
pub fn check_batches<S: Store>(store: &S) {
    let lease = Duration::from_secs(60);
    assert_eq!(ready(store.seen_many(&[])).unwrap(), Vec::<bool>::new());
    ready(store.remember_many(&[], None)).unwrap();
    ready(store.settle(&Settlement::default())).unwrap();

    ready(store.remember_many(&["b-1", "b-3"], None)).unwrap();
    assert_eq!(
        ready(store.seen_many(&["b-1", "b-2", "b-3", "b-1"])).unwrap(),
        vec![true, false, true, true]
    );
    let plain = Settlement {
        remember: &[("b-7", None), ("b-8", None)],
        ..Settlement::default()
    };
    assert_eq!(ready(store.settle(&plain)).unwrap().kept, vec![true, true]);
    assert_eq!(
        ready(store.seen_many(&["b-7", "b-8"])).unwrap(),
        vec![true, true]
    );
    if !store.capabilities().claim {
        return;
    }
    assert_eq!(ready(store.claim_many(&[], lease)).unwrap(), vec![]);
    ready(store.claim("b-4", lease)).unwrap();
    let claims = ready(store.claim_many(&["b-1", "b-2", "b-4", "b-5"], lease)).unwrap();
    assert_eq!(claims[0], Claim::Seen);
    assert!(matches!(claims[1], Claim::Acquired(_)), "{claims:?}");
    assert_eq!(claims[2], Claim::Held);
    let (Claim::Acquired(t2), Claim::Acquired(t5)) = (&claims[1], &claims[3]) else {
        panic!("{claims:?}");
    };
    assert_ne!(t2, t5);
    // b-2 succeeded, b-5 failed: one call settles both.
    let step = Settlement {
        remember: &[("b-2", Some(t2))],
        release: &[("b-5", t5)],
        ..Settlement::default()
    };
    assert_eq!(ready(store.settle(&step)).unwrap().kept, vec![true]);
    assert_eq!(
        ready(store.seen_many(&["b-2", "b-5"])).unwrap(),
        vec![true, false]
    );
    assert!(matches!(
        ready(store.claim("b-5", lease)).unwrap(),
        Claim::Acquired(_)
    ));
    // A second claim of one key in the same batch finds the first one's claim.
    let twice = ready(store.claim_many(&["b-6", "b-6"], lease)).unwrap();
    assert!(matches!(twice[0], Claim::Acquired(_)), "{twice:?}");
    assert_eq!(twice[1], Claim::Held);
}

/// One delivery through a guard, returning the outcome.
pub fn deliver<S: Store>(guard: &Guard<S>, id: &str, ok: bool) -> Outcome<String> {
    ready(guard.process(envelope(id).as_bytes(), async |_| {
        if ok { Ok(()) } else { Err("boom".into()) }
    }))
}

/// The claim a fresh `claim` must take.
pub fn acquire<S: Store>(store: &S, key: &str, lease: Duration) -> ClaimToken {
    match ready(store.claim(key, lease)).unwrap() {
        Claim::Acquired(token) => token,
        other => panic!("{key}: expected a claim, got {other:?}"),
    }
}

/// Leases kept and lost (see the table in docs/stores.md): renewals and fenced
/// commits succeed only for the claim's owner. `expire()` must make a claim of
/// `short` run out (a manual clock advanced, or a real sleep).
pub fn check_leases<S: Store>(store: &S, short: Duration, expire: impl Fn()) {
    let long = Duration::from_secs(60);
    assert!(store.capabilities().renew, "this store keeps leases");

    // Kept: renewed, then committed under its own claim.
    let mine = acquire(store, "l-kept", short);
    assert_eq!(ready(store.renew("l-kept", &mine, long)).unwrap(), true);
    expire();
    assert_eq!(
        ready(store.claim("l-kept", long)).unwrap(),
        Claim::Held,
        "the renewed claim outlives its first lease"
    );
    assert_eq!(
        ready(store.remember_fenced("l-kept", &mine, None)).unwrap(),
        true
    );
    assert!(ready(store.seen("l-kept")).unwrap());

    // Lost to another consumer: its lease ran out and someone else claimed.
    let first = acquire(store, "l-taken", short);
    expire();
    let second = acquire(store, "l-taken", long);
    assert_eq!(ready(store.renew("l-taken", &first, long)).unwrap(), false);
    assert_eq!(
        ready(store.remember_fenced("l-taken", &first, None)).unwrap(),
        false,
        "the first owner's commit is fenced off"
    );
    assert!(
        !ready(store.seen("l-taken")).unwrap(),
        "the lost commit did not overwrite the live claim"
    );
    assert_eq!(
        ready(store.remember_fenced("l-taken", &second, None)).unwrap(),
        true
    );
    assert!(ready(store.seen("l-taken")).unwrap());

    // Lost to a forget while the handler ran: reported lost, and the effect that
    // did happen is still remembered (the key was free).
    let token = acquire(store, "l-forgotten", long);
    ready(store.forget("l-forgotten")).unwrap();
    assert_eq!(
        ready(store.renew("l-forgotten", &token, long)).unwrap(),
        false
    );
    assert_eq!(
        ready(store.remember_fenced("l-forgotten", &token, None)).unwrap(),
        false
    );
    assert!(ready(store.seen("l-forgotten")).unwrap());

    // Lost because another consumer already finished the id.
    let late = acquire(store, "l-done", short);
    expire();
    let winner = acquire(store, "l-done", long);
    assert!(ready(store.remember_fenced("l-done", &winner, None)).unwrap());
    assert_eq!(
        ready(store.remember_fenced("l-done", &late, None)).unwrap(),
        false
    );

    // One settle: remember fenced, release, renew, answered in order.
    let a = acquire(store, "l-a", long);
    let b = acquire(store, "l-b", long);
    let c = acquire(store, "l-c", long);
    let step = Settlement {
        remember: &[("l-a", Some(&a)), ("l-plain", None), ("l-c", Some(&b))],
        ttl: None,
        release: &[("l-b", &b)],
        renew: &[("l-c", &c), ("l-b", &a)],
        lease: long,
    };
    let settled = ready(store.settle(&step)).unwrap();
    assert_eq!(settled.kept, vec![true, true, false]);
    assert_eq!(settled.renewed, vec![true, false]);
    assert_eq!(settled.release_error, None);
    assert_eq!(
        ready(store.seen_many(&["l-a", "l-plain", "l-b", "l-c"])).unwrap(),
        vec![true, true, false, false],
        "a wrong token neither commits nor breaks l-c's live claim"
    );
    assert!(matches!(
        ready(store.claim("l-b", long)).unwrap(),
        Claim::Acquired(_)
    ));
}

// ---- backends for the testkit and the history checker -----------------------------

/// Opens clients of one Redis prefix in `dialect` (each call a new
/// connection), and the cleanup that drops the prefix's keys.
#[cfg(feature = "redis")]
pub fn redis_backend(
    tag: &str,
    dialect: bq_dedupe_stores::Dialect,
) -> (
    impl Fn() -> bq_dedupe_stores::RedisStore + Send + Sync + 'static,
    RedisCleanup,
) {
    let url = redis_url();
    let prefix = redis_prefix(&format!("{tag}-{}", dialect.name()));
    let cleanup = RedisCleanup {
        url: url.clone(),
        prefix: prefix.clone(),
    };
    let open = move || {
        bq_dedupe_stores::RedisStore::connect_dialect(&url, prefix.clone(), dialect)
            .expect("connect to Redis")
    };
    (open, cleanup)
}

/// Opens clients of one prefix on the test cluster, and its cleanup.
#[cfg(feature = "redis")]
pub fn cluster_backend(
    tag: &str,
) -> (
    impl Fn() -> bq_dedupe_stores::RedisStore + Send + Sync + 'static,
    ClusterCleanup,
) {
    cluster_backend_under(redis_prefix(tag))
}

/// [`cluster_backend`] under `prefix` (one with a hash tag keeps every key of
/// the fleet in one slot).
#[cfg(feature = "redis")]
pub fn cluster_backend_under(
    prefix: String,
) -> (
    impl Fn() -> bq_dedupe_stores::RedisStore + Send + Sync + 'static,
    ClusterCleanup,
) {
    let spec = redis_cluster_spec();
    let nodes = cluster_nodes(&spec);
    let cleanup = ClusterCleanup {
        spec,
        prefix: prefix.clone(),
    };
    let open = move || {
        bq_dedupe_stores::RedisStore::connect_cluster(
            &nodes,
            prefix.clone(),
            bq_dedupe_stores::Dialect::Native,
        )
        .expect("connect to the cluster")
    };
    (open, cleanup)
}

/// The id of the master a `CLUSTER NODES` view gives `slot` to.
#[cfg(feature = "redis")]
fn owner_in(view: &str, slot: u16) -> Option<String> {
    view.lines().find_map(|line| {
        // "<id> <ip:port@cport> <flags> <master> <ping> <pong> <epoch> <link> <slots...>"
        let f: Vec<&str> = line.split(' ').collect();
        let owns = f.iter().skip(8).any(|range| {
            let (lo, hi) = range.split_once('-').unwrap_or((range, range));
            matches!((lo.parse::<u16>(), hi.parse::<u16>()), (Ok(lo), Ok(hi)) if (lo..=hi).contains(&slot))
        });
        (f.len() > 8 && f[2].contains("master") && owns).then(|| f[0].to_string())
    })
}

/// Brings the cluster's nodes to one slot map after a test moved slots: a
/// slot the nodes give to different masters (a move's epoch race can leave
/// that for good) is given to the master most of them name, by every node,
/// that master's epoch bumped so its claim wins, until every node agrees
/// three times in a row. The next test's clients then read no node's stale
/// map (a later test binary's calls met MOVED twice, on a fresh connection
/// too, and failed: a flake of `make test`). Best effort: said, not failed,
/// if the nodes still disagree after about 20 s.
#[cfg(feature = "redis")]
pub fn heal_the_cluster(spec: &str) {
    let connect = |url: &str| redis::Client::open(url)?.get_connection();
    let nodes = cluster_nodes(spec);
    let view_of = |node: &String| -> Option<String> {
        let mut c = connect(node).ok()?;
        redis::cmd("CLUSTER").arg("NODES").query(&mut c).ok()
    };
    let mut agreed = 0;
    for _ in 0..100 {
        let views: Vec<String> = nodes.iter().filter_map(view_of).collect();
        let moving = views.iter().any(|v| v.contains('['));
        let mut healed = false;
        for slot in 0..16384u16 {
            let owners: Vec<Option<String>> = views.iter().map(|v| owner_in(v, slot)).collect();
            if owners.windows(2).all(|w| w[0] == w[1]) && !moving {
                continue;
            }
            let Some(owner) = owners
                .iter()
                .flatten()
                .max_by_key(|o| owners.iter().filter(|p| p.as_ref() == Some(*o)).count())
                .cloned()
            else {
                continue;
            };
            for node in &nodes {
                if let Ok(mut c) = connect(node) {
                    let _: redis::RedisResult<()> = redis::cmd("CLUSTER")
                        .arg("SETSLOT")
                        .arg(slot)
                        .arg("STABLE")
                        .query(&mut c);
                    let _: redis::RedisResult<()> = redis::cmd("CLUSTER")
                        .arg("SETSLOT")
                        .arg(slot)
                        .arg("NODE")
                        .arg(&owner)
                        .query(&mut c);
                    let mine: redis::RedisResult<String> =
                        redis::cmd("CLUSTER").arg("MYID").query(&mut c);
                    if mine.is_ok_and(|id| id == owner) {
                        let _: redis::RedisResult<String> =
                            redis::cmd("CLUSTER").arg("BUMPEPOCH").query(&mut c);
                    }
                }
            }
            healed = true;
        }
        agreed = if healed || views.len() != nodes.len() {
            0
        } else {
            agreed + 1
        };
        if agreed == 3 {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!("the test cluster's nodes still disagree on some slots after about 20 s");
}

/// Moves the slot of `key` from its master to another, keys and all, as
/// `redis-cli --cluster reshard` does: once every node agrees on its owner
/// (the last move's news has spread), its keys are moved until none is left,
/// then the slot is given to the new master, told first (it bumps its epoch).
/// `false`: not moved, the nodes still disagreeing on its owner after 3 s.
#[cfg(feature = "redis")]
pub fn move_slot_of(spec: &str, key: &str) -> redis::RedisResult<bool> {
    let connect = |url: &str| redis::Client::open(url)?.get_connection();
    let nodes = cluster_nodes(spec);
    let slot: u16 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(key)
        .query(&mut connect(&nodes[0])?)?;
    let mut table = String::new();
    for _ in 0..300 {
        let views = nodes
            .iter()
            .map(|node| {
                redis::cmd("CLUSTER")
                    .arg("NODES")
                    .query::<String>(&mut connect(node)?)
            })
            .collect::<redis::RedisResult<Vec<String>>>()?;
        let owners: std::collections::BTreeSet<_> =
            views.iter().map(|view| owner_in(view, slot)).collect();
        if owners.len() == 1 && !owners.contains(&None) {
            table = views.into_iter().next().unwrap_or_default();
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    // Still split (the cluster's gossip settles an epoch race later): no move
    // this time.
    let Some(owner) = owner_in(&table, slot) else {
        return Ok(false);
    };
    let masters: Vec<(String, String)> = table
        .lines()
        .map(|line| line.split(' ').collect::<Vec<_>>())
        .filter(|f| f.len() > 2 && f[2].contains("master"))
        .map(|f| {
            (
                f[0].to_string(),
                f[1].split('@').next().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let (from_id, from_addr) = masters
        .iter()
        .find(|m| m.0 == owner)
        .expect("its address")
        .clone();
    let (to_id, to_addr) = masters
        .iter()
        .find(|m| m.0 != owner)
        .expect("another master")
        .clone();
    let mut from = connect(&format!("redis://{from_addr}"))?;
    let mut to = connect(&format!("redis://{to_addr}"))?;
    let setslot = |conn: &mut redis::Connection, how: &str, id: &str| {
        redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg(how)
            .arg(id)
            .query::<()>(conn)
    };
    setslot(&mut to, "IMPORTING", &from_id)?;
    setslot(&mut from, "MIGRATING", &to_id)?;
    let (host, port) = to_addr.rsplit_once(':').expect("host:port");
    loop {
        let keys: Vec<String> = redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(slot)
            .arg(1000)
            .query(&mut from)?;
        if keys.is_empty() {
            break;
        }
        redis::cmd("MIGRATE")
            .arg(host)
            .arg(port)
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("KEYS")
            .arg(&keys)
            .query::<()>(&mut from)?;
    }
    setslot(&mut to, "NODE", &to_id)?;
    setslot(&mut from, "NODE", &to_id)?;
    for (_, addr) in masters
        .iter()
        .filter(|m| m.1 != to_addr && m.1 != from_addr)
    {
        setslot(&mut connect(&format!("redis://{addr}"))?, "NODE", &to_id)?;
    }
    Ok(true)
}

/// How a call met the test's own kill of a server connection behind PgBouncer
/// (`pg_terminate_backend`): the server's 57P01, or the pooler closing the
/// client's connection.
pub const KILLED_BEHIND_PGBOUNCER: &[&str] = &["57P01", "connection closed"];

/// A fresh PostgreSQL table for a run, with a table of effect rows beside it
/// (`effects` is its name: `key TEXT`); dropped with `cleanup`.
#[cfg(feature = "postgres")]
pub struct PgBackend {
    pub url: String,
    pub table: String,
    pub effects: String,
    pub cleanup: (PgCleanup, PgCleanup),
}

#[cfg(feature = "postgres")]
impl PgBackend {
    pub fn new(tag: &str) -> Self {
        let url = postgres_url();
        let table = postgres_table(tag);
        let effects = format!("{table}_fx");
        pg().batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {effects} (key TEXT NOT NULL)"
        ))
        .unwrap();
        let cleanup = (
            PgCleanup {
                url: url.clone(),
                table: table.clone(),
            },
            PgCleanup {
                url: url.clone(),
                table: effects.clone(),
            },
        );
        PgBackend {
            url,
            table,
            effects,
            cleanup,
        }
    }

    /// Opens a client (a new pool) of the run's table.
    pub fn opener(&self) -> impl Fn() -> bq_dedupe_stores::PostgresStore + Send + Sync + 'static {
        let (url, table) = (self.url.clone(), self.table.clone());
        move || {
            // Behind PgBouncer the history checker's kills (`pg_terminate_backend`)
            // can meet a connect on a server connection it was lent (the
            // server's 57P01, or the pooler closing the client): once more.
            let killed = |e: &bq_dedupe::StoreError| {
                KILLED_BEHIND_PGBOUNCER
                    .iter()
                    .any(|m| e.message.contains(m))
            };
            let mut tries = 0;
            loop {
                match bq_dedupe_stores::PostgresStore::connect(&url, &table) {
                    Ok(store) => return store,
                    Err(e) if tries < 5 && killed(&e) => tries += 1,
                    Err(e) => panic!("connect to PostgreSQL: {e:?}"),
                }
            }
        }
    }

    /// The statement that writes one effect row (`$1`: its key).
    pub fn insert(&self) -> String {
        format!("INSERT INTO {} (key) VALUES ($1)", self.effects)
    }

    /// Counts a key's effect rows, on a client of its own.
    pub fn counter(&self) -> impl FnMut(&str) -> u64 + 'static {
        let mut client = pg();
        let count = format!("SELECT count(*) FROM {} WHERE key = $1", self.effects);
        move |key| {
            let n: i64 = client.query_one(&count, &[&key]).unwrap().get(0);
            n as u64
        }
    }
}

// ---- the matrix: every backend of the stores' table (`BACKENDS`) --------------------

use bq_dedupe::store::Capabilities;
use bq_dedupe_stores::{AnyStore, BACKENDS, Backend, TestPlace, TestServer};

/// The spec a test server's variable holds. Unset, the test fails naming the
/// script that starts the server: a missing server is a misconfigured run,
/// never a skip.
pub fn server_spec(server: &TestServer) -> String {
    match std::env::var(server.var) {
        Ok(spec) if !spec.is_empty() => spec,
        _ => panic!(
            "{} is not set: run under {} or scripts/with-stores.sh (make test does)",
            server.var, server.script
        ),
    }
}

/// The test server of the table's row `name` (`tls`: its TLS one).
pub fn server_of(name: &str, tls: bool) -> &'static TestServer {
    let backend = BACKENDS.iter().find(|b| b.name == name);
    match (backend.map(|b| &b.test), tls) {
        (Some(TestPlace::Server { plain, .. }), false) => plain,
        (Some(TestPlace::Server { tls: Some(tls), .. }), true) => tls,
        _ => panic!("no test server for {name} (tls: {tls}) in BACKENDS"),
    }
}

/// `spec` with `query` added to its query.
pub fn with_query(spec: &str, query: &str) -> String {
    let sep = if spec.contains('?') { '&' } else { '?' };
    format!("{spec}{sep}{query}")
}

/// One backend of the table, in one of its record formats, at a place of its
/// own (a new SQLite file, Redis key prefix or PostgreSQL table), its records
/// dropped with it.
pub struct Subject {
    pub backend: &'static Backend,
    /// The record format's query parameter (a row's `formats`); `None`: ours.
    pub format: Option<&'static str>,
    /// What its store offers: a check reaches as far as these go.
    pub caps: Capabilities,
    pub spec: String,
    /// What keeps its records apart: the file, key prefix or table.
    pub place: String,
    name: String,
    /// The memory store: one per process, so every open shares this one.
    memory: Option<std::sync::Arc<AnyStore>>,
    _cleanup: Box<dyn std::any::Any + Send + Sync>,
}

impl Subject {
    /// At a place named by `tag`, in our record format; the store opened once
    /// (tables created).
    pub fn new(backend: &'static Backend, tag: &str) -> Subject {
        Subject::in_format(backend, None, tag)
    }

    /// Another subject of the same backend and format, at a place of its own.
    pub fn fresh(&self, tag: &str) -> Subject {
        Subject::in_format(self.backend, self.format, tag)
    }

    /// [`Subject::new`] in `format` (one of the row's `formats`).
    pub fn in_format(
        backend: &'static Backend,
        format: Option<&'static str>,
        tag: &str,
    ) -> Subject {
        let name = match format {
            Some(format) => format!("{} {format}", backend.name),
            None => backend.name.to_owned(),
        };
        let tag = format!("{tag}-{}", name.replace([' ', '='], "-"));
        let mut place = String::new();
        let (spec, cleanup): (String, Box<dyn std::any::Any + Send + Sync>) = match &backend.test {
            TestPlace::Fresh => (backend.schemes[0].to_owned(), Box::new(())),
            TestPlace::File => {
                let db = TempDb::new(&tag);
                place = db.path().display().to_string();
                (format!("{}{place}", backend.schemes[0]), Box::new(db))
            }
            TestPlace::Server { plain, isolate, .. } => {
                let url = server_spec(plain);
                let (isolated, cleanup): (String, Box<dyn std::any::Any + Send + Sync>) =
                    match *isolate {
                        "table" => {
                            let table = postgres_table(&tag);
                            let url = url.clone();
                            (table.clone(), Box::new(PgCleanup { url, table }))
                        }
                        "prefix" if url.contains("+cluster://") => {
                            let prefix = redis_prefix(&tag);
                            let spec = url.clone();
                            (prefix.clone(), Box::new(ClusterCleanup { spec, prefix }))
                        }
                        "prefix" => {
                            let prefix = redis_prefix(&tag);
                            let url = url.clone();
                            (prefix.clone(), Box::new(RedisCleanup { url, prefix }))
                        }
                        // Another store's parameter: a fresh value, left on the
                        // wrapper's throwaway server (no cleanup known here).
                        _ => (unique(&tag), Box::new(())),
                    };
                let value = isolated.replace(':', "%3A");
                place = isolated;
                (with_query(&url, &format!("{isolate}={value}")), cleanup)
            }
        };
        let spec = match format {
            Some(format) => with_query(&spec, format),
            None => spec,
        };
        let memory = matches!(backend.test, TestPlace::Fresh)
            .then(|| std::sync::Arc::new(AnyStore::from_spec(&spec).unwrap()));
        let mut subject = Subject {
            backend,
            format,
            caps: Capabilities::default(),
            spec,
            place,
            name,
            memory,
            _cleanup: cleanup,
        };
        subject.caps = subject.open().capabilities();
        subject
    }

    /// The backend's name, and its format's parameter if not ours
    /// (`redis dialect=go`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A new client of the subject's records (a new connection or pool).
    pub fn open(&self) -> std::sync::Arc<AnyStore> {
        self.opener()()
    }

    /// What [`Subject::open`] does, owning what it needs (for the testkit).
    pub fn opener(&self) -> impl Fn() -> std::sync::Arc<AnyStore> + Send + Sync + 'static {
        let (name, spec, memory) = (self.name.clone(), self.spec.clone(), self.memory.clone());
        move || {
            memory.clone().unwrap_or_else(|| {
                let opened = AnyStore::from_spec(&spec);
                std::sync::Arc::new(opened.unwrap_or_else(|e| panic!("{name}: {spec}: {e}")))
            })
        }
    }

    /// The record rules its store follows (the testkit's model of it).
    pub fn rules(&self) -> bq_dedupe::store::record::Rules {
        self.open().record_rules()
    }

    /// `spec` opened, naming this subject if it fails.
    pub fn open_spec(&self, spec: &str) -> AnyStore {
        AnyStore::from_spec(spec).unwrap_or_else(|e| panic!("{}: opening {spec}: {e}", self.name()))
    }
}

/// Runs `check` on every backend of the table, in each of its record formats,
/// whose subject `pick` accepts, each at a place of its own (`tag`) and in its
/// own thread (named for it), all at once; then fails naming every subject
/// whose check failed. A subject left out is named in the output.
pub fn on_backends(
    tag: &str,
    pick: impl Fn(&Subject) -> bool + Sync,
    check: impl Fn(&Subject) + Sync,
) {
    // A build with some backends' features off checks the ones it has.
    let subjects: Vec<(&'static Backend, Option<&'static str>)> = BACKENDS
        .iter()
        .filter(|b| b.built)
        .flat_map(|b| {
            std::iter::once(None)
                .chain(b.formats.iter().copied().map(Some))
                .map(move |f| (b, f))
        })
        .collect();
    let (failed, picked): (Vec<String>, Vec<bool>) = std::thread::scope(|s| {
        let runs: Vec<_> = subjects
            .into_iter()
            .map(|(backend, format)| {
                let (check, pick) = (&check, &pick);
                let name =
                    format.map_or(backend.name.to_owned(), |f| format!("{} {f}", backend.name));
                let run = std::thread::Builder::new()
                    .name(name.clone())
                    .spawn_scoped(s, move || {
                        let subject = Subject::in_format(backend, format, tag);
                        let picked = pick(&subject);
                        match picked {
                            true => check(&subject),
                            false => {
                                println!("{tag}: {} left out ({:?})", subject.name(), subject.caps)
                            }
                        }
                        picked
                    })
                    .unwrap();
                (name, run)
            })
            .collect();
        runs.into_iter()
            .map(|(name, run)| match run.join() {
                Ok(picked) => (String::new(), picked),
                Err(_) => (name, true),
            })
            .unzip()
    });
    assert!(picked.contains(&true), "{tag}: no backend picked");
    let failed: Vec<String> = failed.into_iter().filter(|n| !n.is_empty()).collect();
    assert!(
        failed.is_empty(),
        "{tag} failed on {failed:?} (their panics are above)"
    );
}

/// Every subject whose test store is on a server (on the server's clock).
pub fn on_a_server(subject: &Subject) -> bool {
    matches!(subject.backend.test, TestPlace::Server { .. })
}

/// Every subject whose store claims (claiming mode).
pub fn claiming(subject: &Subject) -> bool {
    subject.caps.claim
}

/// Every subject whose store renews claims and fences commits (leases kept).
pub fn fenced(subject: &Subject) -> bool {
    subject.caps.renew
}

/// Every subject in our own record format.
pub fn ours(subject: &Subject) -> bool {
    subject.format.is_none()
}

/// [`on_backends`] on every backend of the table, in every format.
pub fn on_every_backend(tag: &str, check: impl Fn(&Subject) + Sync) {
    on_backends(tag, |_| true, check);
}
