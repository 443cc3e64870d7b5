//! A Redis Cluster pipeline written to some nodes and not to another, whose
//! connection fails at its `PING` (a master still loading after a restart,
//! one at `maxclients`, an ACL that differs): the client stops with the other
//! nodes' replies unread. A binary of its own: it takes `PING` from the
//! default user on one node of the test cluster while it runs.

mod common;

use bq_dedupe::Store;
use bq_dedupe_stores::{Dialect, RedisStore};
use common::{ClusterCleanup, cluster_nodes, ready, redis_cluster_spec, redis_prefix};

/// A connection a failed pipeline left was kept, and every later call on it
/// read an earlier call's replies: a `GET` read the `d` of an id done, and a
/// new id was skipped, never run (a review; the write order over the nodes is
/// the client's, so a few rounds). Such a connection now goes.
#[test]
fn a_cluster_pipeline_cut_short_leaves_no_reply_for_the_next_call() {
    let spec = redis_cluster_spec();
    let nodes = cluster_nodes(&spec);
    let prefix = redis_prefix("partial");
    let _clean = ClusterCleanup {
        spec: spec.clone(),
        prefix: prefix.clone(),
    };
    let direct = |node: &str| redis::Client::open(node).unwrap().get_connection().unwrap();
    // Whether `node` serves `id`'s key (another answers MOVED).
    let serves = |node: &str, id: &str| {
        let mut exists = redis::cmd("EXISTS");
        exists.arg(format!("{prefix}{id}"));
        exists.query::<i64>(&mut direct(node)).is_ok()
    };
    let on = |node: &str, tag: &str| -> String {
        // (Bounded: on a node that serves no slot it looped for ever.)
        (0..10_000)
            .map(|i| format!("{tag}-{i}"))
            .find(|id| serves(node, id))
            .expect("no id of 10,000 on that node")
    };
    let (denied, other) = (&nodes[2], &nodes[1]);
    let _ping_back = PingBack(direct(denied));
    let mut cut = 0;
    for round in 0..12 {
        let (done, new, elsewhere) = (
            on(other, &format!("done{round}")),
            on(other, &format!("new{round}")),
            on(denied, &format!("x{round}")),
        );
        let open = || RedisStore::connect_cluster(&nodes, prefix.clone(), Dialect::Native);
        ready(open().unwrap().remember(&done, None)).unwrap();
        set_ping(&mut direct(denied), false);
        let store = open().unwrap();
        let both = ready(store.seen_many(&[&done, &elsewhere]));
        set_ping(&mut direct(denied), true);
        cut += usize::from(both.is_err());
        let next = ready(store.seen_many(&[&new]));
        assert_eq!(
            next.as_deref().ok(),
            Some(&[false][..]),
            "round {round}: {new} was never remembered (the call before: {both:?})"
        );
    }
    assert!(cut > 0, "the PING refusal never cut a pipeline short");
}

/// Gives `PING` back to the default user (`on`) or takes it (`off`).
fn set_ping(node: &mut redis::Connection, on: bool) {
    let rule = if on { "+ping" } else { "-ping" };
    let mut set = redis::cmd("ACL");
    set.arg("SETUSER").arg("default").arg(rule);
    set.query::<()>(node).unwrap();
}

/// Gives `PING` back on drop, a failed test's too: the cluster serves the
/// test binaries after this one.
struct PingBack(redis::Connection);

impl Drop for PingBack {
    fn drop(&mut self) {
        set_ping(&mut self.0, true);
    }
}
