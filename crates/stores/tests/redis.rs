//! `RedisStore` against a real server at `BQ_TEST_REDIS_URL` (a failure when unset).

mod common;

use std::time::Duration;

use bq_dedupe::{Guard, Outcome, Store, store::Claim, store::StoreErrorKind};
use bq_dedupe_stores::{RedisStore, StoreStats};
use common::{RedisCleanup, deliver, ready, redis_prefix, redis_url};

/// A store under a fresh prefix, and the cleanup of that prefix.
fn store(tag: &str) -> (RedisStore, RedisCleanup) {
    let url = redis_url();
    let prefix = redis_prefix(tag);
    let store = RedisStore::connect(&url, prefix.clone()).unwrap();
    (store, RedisCleanup { url, prefix })
}

/// The raw value behind a store key, to check the wire format.
fn raw_get(url: &str, key: &str) -> Option<Vec<u8>> {
    let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
    redis::cmd("GET").arg(key).query(&mut conn).unwrap()
}

/// Beyond the hostile keys every backend stores (any.rs): the
/// protocol-looking id was a key, not a command.
#[test]
fn redis_a_protocol_looking_id_is_a_key() {
    let (store, clean) = store("hostile");
    ready(store.remember("*1\r\n$4\r\nPING\r\n", None)).unwrap();
    let key = format!("{}*1\r\n$4\r\nPING\r\n", clean.prefix);
    assert_eq!(raw_get(&clean.url, &key).as_deref(), Some(&b"d"[..]));
}

#[test]
fn redis_wire_format_is_d_and_c_token_under_the_prefix() {
    let (store, clean) = store("wire");
    ready(store.remember("done", None)).unwrap();
    let Claim::Acquired(token) = ready(store.claim("busy", Duration::from_secs(60))).unwrap()
    else {
        panic!("free key");
    };
    let get = |k: &str| raw_get(&clean.url, &format!("{}{k}", clean.prefix));
    assert_eq!(get("done").as_deref(), Some(&b"d"[..]));
    assert_eq!(get("busy"), Some(format!("c:{}", token.0).into_bytes()));
    assert_eq!(
        raw_get(&clean.url, "done"),
        None,
        "nothing outside the prefix"
    );
    assert_eq!(store.prefix(), clean.prefix);
}

#[test]
fn redis_prefixes_keep_stores_apart() {
    let (a, _ca) = store("apart-a");
    let (b, _cb) = store("apart-b");
    ready(a.remember("same-id", None)).unwrap();
    assert!(ready(a.seen("same-id")).unwrap());
    assert!(!ready(b.seen("same-id")).unwrap());
    assert!(matches!(
        ready(b.claim("same-id", Duration::from_secs(5))).unwrap(),
        Claim::Acquired(_)
    ));
}

#[test]
fn redis_px_expiry_of_a_remembered_id() {
    let (store, _clean) = store("px");
    // (1 s: the five calls after the first write must come within it on a
    // loaded machine.)
    let ttl = Some(Duration::from_secs(1));
    ready(store.remember("t", ttl)).unwrap();
    ready(store.remember_many(&["t-2"], ttl)).unwrap();
    ready(store.remember("forever", None)).unwrap();
    assert_eq!(
        ready(store.seen_many(&["t", "t-2"])).unwrap(),
        vec![true, true]
    );
    assert_eq!(
        ready(store.claim("t", Duration::from_secs(5))).unwrap(),
        Claim::Seen
    );
    std::thread::sleep(Duration::from_millis(1300));
    assert_eq!(
        ready(store.seen_many(&["t", "t-2", "forever"])).unwrap(),
        vec![false, false, true]
    );
    assert!(matches!(
        ready(store.claim("t", Duration::from_secs(5))).unwrap(),
        Claim::Acquired(_)
    ));

    // Through a guard with a TTL.
    let guard = Guard::new(&store).with_ttl(Duration::from_secs(1));
    assert_eq!(deliver(&guard, "g", true), Outcome::Ran);
    assert_eq!(deliver(&guard, "g", true), Outcome::Skipped);
    std::thread::sleep(Duration::from_millis(1300));
    assert_eq!(deliver(&guard, "g", true), Outcome::Ran);
}

#[test]
fn redis_stats_count_done_and_claims_under_the_prefix() {
    let (store, clean) = store("stats");
    assert_eq!(store.stats().unwrap(), StoreStats::default());
    let keys: Vec<String> = (0..2500).map(|i| format!("id-{i}")).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    ready(store.remember_many(&refs, None)).unwrap();
    ready(store.claim_many(&["c-1", "c-2", "id-0"], Duration::from_secs(60))).unwrap();
    // A foreign key under the prefix, and one just outside it, are not counted.
    let mut conn = redis::Client::open(clean.url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg(format!("{}foreign", clean.prefix))
        .arg("zzz")
        .query(&mut conn)
        .unwrap();
    let outside = clean.prefix.trim_end_matches(':').to_owned();
    let _: () = redis::cmd("SET")
        .arg(&outside)
        .arg("d")
        .query(&mut conn)
        .unwrap();
    assert_eq!(
        store.stats().unwrap(),
        StoreStats {
            remembered: 2500,
            claimed: 2,
            expired: 0
        }
    );
    assert_eq!(store.purge_expired().unwrap(), 0);
    let _: () = redis::cmd("DEL").arg(&outside).query(&mut conn).unwrap();
}

#[test]
fn redis_glob_characters_in_the_prefix_match_only_themselves() {
    let url = redis_url();
    let base = redis_prefix("glob");
    let star = RedisStore::connect(&url, format!("{base}*:")).unwrap();
    let plain = RedisStore::connect(&url, format!("{base}x:")).unwrap();
    let _c1 = RedisCleanup {
        url: url.clone(),
        prefix: format!("{base}*:"),
    };
    let _c2 = RedisCleanup {
        url: url.clone(),
        prefix: format!("{base}x:"),
    };
    ready(plain.remember("a", None)).unwrap();
    ready(star.remember("b", None)).unwrap();
    assert_eq!(star.stats().unwrap().remembered, 1);
    assert_eq!(plain.stats().unwrap().remembered, 1);
}

#[test]
fn redis_unreachable_server_is_unavailable() {
    // Port 1 on loopback: nothing listens, so the connection is refused at once.
    let e = RedisStore::connect("redis://127.0.0.1:1/0", "p:").unwrap_err();
    assert_eq!(e.kind, StoreErrorKind::Unavailable, "{e}");
    let e = RedisStore::connect("not a url", "p:").unwrap_err();
    assert_eq!(e.kind, StoreErrorKind::Invalid, "{e}");
}

/// Scripts go by SHA (`EVALSHA`); a server that lost them (restart, failover,
/// `SCRIPT FLUSH`) gets them again and the batch goes through.
#[test]
fn redis_scripts_are_reloaded_after_script_flush() {
    let url = redis_url();
    let prefix = redis_prefix("flush");
    let _clean = RedisCleanup {
        url: url.clone(),
        prefix: prefix.clone(),
    };
    let store = RedisStore::connect(&url, prefix).unwrap();
    let mut conn = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    for round in 0..2 {
        let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut conn).unwrap();
        let id = format!("f-{round}");
        let Claim::Acquired(token) = ready(store.claim(&id, Duration::from_secs(60))).unwrap()
        else {
            panic!("free key");
        };
        assert!(ready(store.renew(&id, &token, Duration::from_secs(60))).unwrap());
        let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut conn).unwrap();
        assert!(ready(store.remember_fenced(&id, &token, None)).unwrap());
        assert!(ready(store.seen(&id)).unwrap());
    }
}

/// A claim is `SET NX` then `GET` in one pipeline, not one atomic step: a done
/// record that expires between the two left the `GET` nothing to read, and the
/// claim answered `Held` with no claim anywhere (the history checker's seed
/// 4730328025367085031 on the cluster). With no claim ever taken, every answer
/// must be `Seen` (still done) or `Acquired` (expired). Each round remembers
/// 500 ids for 2 to 3 ms and claims them all in one pipeline as they run out.
#[test]
fn redis_a_claim_never_answers_held_when_no_claim_exists() {
    let (store, _clean) = store("vanishing");
    let (mut held, mut answers) = (0, 0);
    for round in 0..200 {
        let keys: Vec<String> = (0..500).map(|i| format!("r{round}-{i}")).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let ttl = Duration::from_millis(2 + round % 2);
        ready(store.remember_many(&refs, Some(ttl))).unwrap();
        let until = std::time::Instant::now() + Duration::from_micros(round * 37 % 1500);
        while std::time::Instant::now() < until {}
        for claim in ready(store.claim_many(&refs, Duration::from_secs(60))).unwrap() {
            answers += 1;
            held += usize::from(claim == Claim::Held);
        }
    }
    assert_eq!(
        held, 0,
        "{held} of {answers} claims answered Held with no claim taken"
    );
}

/// A server of this test's own that requires a password (`requirepass`):
/// opened without one, the store fails at once, saying so (it opened, and
/// every call then failed `Unavailable` on `NOAUTH`, retried for ever); with
/// it, the store works; the password is in no message.
#[test]
fn redis_a_server_that_requires_a_password_is_refused_at_open_without_one() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = std::env::temp_dir().join(common::unique("bq-redis-pw"));
    std::fs::create_dir_all(&dir).unwrap();
    let server = std::process::Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
        .args([
            "--requirepass",
            "s3cret-pw",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .current_dir(&dir)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("redis-server (scripts/with-redis.sh installs it)");
    struct Stop(std::process::Child, std::path::PathBuf);
    impl Drop for Stop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
            let _ = std::fs::remove_dir_all(&self.1);
        }
    }
    let _stop = Stop(server, dir);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "redis-server did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let without = RedisStore::connect(&format!("redis://127.0.0.1:{port}"), "pw:".to_string())
        .map(drop)
        .unwrap_err();
    assert_ne!(without.kind, StoreErrorKind::Unavailable, "{without}");
    assert!(without.message.contains("password"), "{without}");
    let wrong = RedisStore::connect(
        &format!("redis://:nope@127.0.0.1:{port}"),
        "pw:".to_string(),
    )
    .map(drop)
    .unwrap_err();
    assert!(!wrong.message.contains("nope"), "{wrong}");
    let with = RedisStore::connect(&format!("redis://:s3cret-pw@127.0.0.1:{port}"), "pw:").unwrap();
    ready(with.remember("a", None)).unwrap();
    assert!(ready(with.seen("a")).unwrap());
    // A user whose ACL grants the store's commands but not PING opens too
    // (a review's finding: the PING alone refused it).
    let mut admin = redis::Client::open(format!("redis://:s3cret-pw@127.0.0.1:{port}"))
        .unwrap()
        .get_connection()
        .unwrap();
    redis::cmd("ACL")
        .arg(
            &[
                "SETUSER",
                "app",
                "on",
                ">app-pw",
                "~*",
                "+@read",
                "+@write",
                "+@scripting",
                "-ping",
            ][..],
        )
        .query::<()>(&mut admin)
        .unwrap();
    let app = RedisStore::connect(&format!("redis://app:app-pw@127.0.0.1:{port}"), "pw:").unwrap();
    assert!(ready(app.seen("a")).unwrap());
}

/// A fenced commit, renewal or release whose `GET` the server refuses for
/// another reason than the key's type (an ACL's NOPERM) is the call's error,
/// the key left as it was: read with `redis.pcall`, every error was a foreign
/// value, a lost claim with nothing written (a review, h98 F2).
#[test]
fn redis_a_get_the_server_refuses_in_a_script_is_an_error_not_a_lost_claim() {
    let (store, clean) = store("acl-noget");
    let user = format!("bq-noget-{}", std::process::id());
    let mut admin = redis::Client::open(clean.url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let acl = |args: &[&str], admin: &mut redis::Connection| {
        redis::cmd("ACL").arg(args).query::<()>(admin).unwrap();
    };
    acl(
        &["SETUSER", &user, "on", ">pw", "~*", "+@all", "-get"],
        &mut admin,
    );
    let token = common::acquire(&store, "x", Duration::from_secs(60));
    let url = clean
        .url
        .replacen("redis://", &format!("redis://{user}:pw@"), 1);
    let refused = RedisStore::connect(&url, clean.prefix.clone()).unwrap();
    let lease = Duration::from_secs(60);
    let calls = [
        ready(refused.remember_fenced("x", &token, None)).map(drop),
        ready(refused.renew("x", &token, lease)).map(drop),
        ready(refused.release("x", &token)),
    ];
    acl(&["DELUSER", &user], &mut admin);
    for call in calls {
        let e = call.unwrap_err();
        // (NOPERM's text, as a script's command gets it.)
        assert!(e.message.contains("can't run this command"), "{e}");
    }
    // The claim stands, as it was.
    assert!(ready(store.remember_fenced("x", &token, None)).unwrap());
}

/// A password with a character a URL reserves, not percent-encoded: the
/// message says how to write it, and does not show it.
#[test]
fn redis_a_bad_url_says_how_to_write_a_password() {
    let e = RedisStore::connect("redis://:pa?ss@127.0.0.1:1", "p")
        .map(drop)
        .unwrap_err();
    assert_eq!(e.kind, StoreErrorKind::Invalid, "{e}");
    assert!(e.message.contains("percent-encoded"), "{e}");
    assert!(!e.message.contains("pa?ss"), "{e}");
    // Without user info the hint is the URL's form (a `?` forgotten before
    // its parameters was told to percent-encode a password: a trial).
    let e = RedisStore::connect("redis://127.0.0.1:1&dialect=php", "p")
        .map(drop)
        .unwrap_err();
    assert_eq!(e.kind, StoreErrorKind::Invalid, "{e}");
    assert!(e.message.contains("parameters after a `?`"), "{e}");
    assert!(!e.message.contains("percent-encoded"), "{e}");
}

/// A pipeline whose every command fails (here a list under each key; a
/// cluster that is down answers each key of a `stats` page alike) is said as
/// its first failure and a count, not one line per command (a trial saw 20 KB).
#[test]
fn a_pipeline_of_failures_is_said_once() {
    let (store, clean) = store("wrongtype");
    let ids: Vec<String> = (0..50).map(|i| format!("list-{i}")).collect();
    let mut conn = redis::Client::open(clean.url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    for id in &ids {
        let _: () = redis::cmd("RPUSH")
            .arg(format!("{}{id}", clean.prefix))
            .arg("x")
            .query(&mut conn)
            .unwrap();
    }
    let keys: Vec<&str> = ids.iter().map(String::as_str).collect();
    let e = ready(store.seen_many(&keys)).unwrap_err();
    assert!(e.message.contains("and 49 other commands failed"), "{e}");
    assert!(e.message.len() < 300, "{} bytes: {e}", e.message.len());
}

/// A server that evicts keys when full (a `maxmemory` with a policy other than
/// `noeviction`, as managed services often set) is said on start-up: an
/// evicted done record read as never processed and its redelivery ran again,
/// unreported (a review). Quiet with `noeviction`.
#[test]
fn redis_a_server_that_may_evict_keys_is_said_on_start_up() {
    let url = redis_url();
    let mut admin = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let get = |admin: &mut redis::Connection, name: &str| -> String {
        let pair: Vec<String> = redis::cmd("CONFIG")
            .arg("GET")
            .arg(name)
            .query(admin)
            .unwrap();
        pair[1].clone()
    };
    let set = |admin: &mut redis::Connection, name: &str, value: &str| {
        redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value)
            .query::<()>(admin)
            .unwrap()
    };
    let (memory, policy) = (
        get(&mut admin, "maxmemory"),
        get(&mut admin, "maxmemory-policy"),
    );
    // A limit far above what the tests use: nothing is evicted meanwhile.
    set(&mut admin, "maxmemory", "10gb");
    set(&mut admin, "maxmemory-policy", "volatile-lru");
    let evicting = RedisStore::connect(&url, redis_prefix("evict"));
    set(&mut admin, "maxmemory-policy", "noeviction");
    let quiet = RedisStore::connect(&url, redis_prefix("evict"));
    set(&mut admin, "maxmemory-policy", &policy);
    set(&mut admin, "maxmemory", &memory);
    let notes = evicting.unwrap().notes().to_vec();
    assert!(
        notes
            .iter()
            .any(|n| n.contains("maxmemory-policy volatile-lru")),
        "{notes:?}"
    );
    assert_eq!(quiet.unwrap().notes(), [] as [String; 0]);
}
