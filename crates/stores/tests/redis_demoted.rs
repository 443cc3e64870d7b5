//! `RedisStore` against a server demoted to a replica (a failover), on a
//! redis-server of this test's own: a call answered `READONLY` is sent again
//! on a new connection (which, through a name or proxy that moved to the new
//! master, reaches it). The connection was kept, and every later call failed
//! the same way until the process restarted (a review).

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bq_dedupe::{Store, block_on_ready, store::StoreErrorKind};
use bq_dedupe_stores::RedisStore;

/// A redis-server on a free port, killed when dropped.
struct Server(Child, String);

impl Server {
    fn start() -> Server {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server (make test installs it)");
        let url = format!("redis://127.0.0.1:{port}");
        let started = Instant::now();
        while redis::Client::open(url.as_str())
            .and_then(|c| c.get_connection())
            .is_err()
        {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "redis-server did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Server(child, url)
    }

    fn admin(&self, args: &[&str]) {
        let mut conn = redis::Client::open(self.1.as_str())
            .unwrap()
            .get_connection()
            .unwrap();
        redis::cmd(args[0])
            .arg(&args[1..])
            .query::<()>(&mut conn)
            .unwrap();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn redis_a_call_answered_readonly_goes_again_on_a_new_connection() {
    let server = Server::start();
    let store = RedisStore::connect(&server.1, "bq-test:demoted:").unwrap();
    block_on_ready(store.remember("before", None))
        .unwrap()
        .unwrap();
    // Demoted: a replica of a master that is not there, refusing writes.
    server.admin(&["REPLICAOF", "127.0.0.1", "1"]);
    let e = block_on_ready(store.remember("during", None))
        .unwrap()
        .expect_err("a replica refuses the write");
    assert_eq!(e.kind, StoreErrorKind::Unavailable, "{e}");
    assert_eq!(store.resent_calls(), 1, "sent again on a new connection");
    // A master again (as the new master a reconnect would reach).
    server.admin(&["REPLICAOF", "NO", "ONE"]);
    block_on_ready(store.remember("after", None))
        .unwrap()
        .unwrap();
    assert!(block_on_ready(store.seen("after")).unwrap().unwrap());
}
