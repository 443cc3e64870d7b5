//! `RedisStore` reconnects after the server drops its connection. A binary of its
//! own: it kills the store's connection by id, and no other test may connect in
//! between.

mod common;

use std::collections::HashSet;

use bq_dedupe::Store;
use bq_dedupe_stores::RedisStore;
use common::{RedisCleanup, ready, redis_prefix, redis_url};

fn client_ids(conn: &mut redis::Connection) -> HashSet<u64> {
    let list: String = redis::cmd("CLIENT").arg("LIST").query(conn).unwrap();
    list.lines()
        .filter_map(|line| line.strip_prefix("id="))
        .filter_map(|rest| rest.split(' ').next()?.parse().ok())
        .collect()
}

#[test]
fn redis_reconnects_once_after_the_connection_is_killed() {
    let url = redis_url();
    let prefix = redis_prefix("reconnect");
    let _clean = RedisCleanup {
        url: url.clone(),
        prefix: prefix.clone(),
    };
    let mut admin = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let before = client_ids(&mut admin);
    let store = RedisStore::connect(&url, prefix).unwrap();
    let ours: Vec<u64> = client_ids(&mut admin)
        .difference(&before)
        .copied()
        .collect();
    assert_eq!(ours.len(), 1, "the store holds one connection");

    ready(store.remember("kept", None)).unwrap();
    for round in 0..3 {
        let id = *client_ids(&mut admin)
            .difference(&before)
            .next()
            .expect("the store is connected");
        let killed: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("ID")
            .arg(id)
            .query(&mut admin)
            .unwrap();
        assert_eq!(killed, 1);
        // The next call finds the connection dead, reconnects and answers.
        assert!(ready(store.seen("kept")).unwrap(), "round {round}");
    }
}
