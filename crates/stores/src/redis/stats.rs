//! `stats` on one server: the store's records found by `SCAN`, counted.

use redis::{Connection, RedisResult};

use super::dialect::{Dialect, Record};
use crate::StoreStats;

/// The store's records on one server: `SCAN MATCH` the prefix, then the values
/// of each page in one pipeline. An id's fingerprint companions are not ids.
pub(super) fn scan_stats(
    conn: &mut Connection,
    prefix: &str,
    dialect: Dialect,
) -> RedisResult<StoreStats> {
    let pattern = format!("{}*", glob_escape(prefix));
    let companion = bq_dedupe::fingerprint::COMPANION_PREFIX.as_bytes();
    let mut stats = StoreStats::default();
    let mut cursor = 0u64;
    loop {
        let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .query(conn)?;
        if !keys.is_empty() {
            // A pipeline of GETs, not MGET: a page's keys may span slots, which a
            // cluster node refuses in one command.
            let mut pipe = redis::pipe();
            for key in &keys {
                pipe.cmd("GET").arg(key);
            }
            let values: Vec<Option<Vec<u8>>> = pipe.query(conn)?;
            let ids = keys.iter().zip(values).filter(|(key, _)| {
                !key.get(prefix.len()..)
                    .is_some_and(|k| k.starts_with(companion))
            });
            for value in ids.filter_map(|(_, value)| value) {
                match dialect.read(&value) {
                    Record::Done => stats.remembered += 1,
                    Record::Claimed => stats.claimed += 1,
                    Record::Foreign => {}
                }
            }
        }
        if next == 0 {
            return Ok(stats);
        }
        cursor = next;
    }
}

/// Escapes glob metacharacters so the prefix matches only itself in `SCAN MATCH`.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 1);
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}
