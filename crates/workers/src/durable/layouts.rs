//! The layout registry: the shard layouts a deployment has resharded through,
//! each with when its first consumer started, kept in one object
//! (`bq-dedupe/layouts`) by consumers that run while resharding. It is what lets
//! a second reshard inside one dedupe window be refused: the first reshard's
//! old layout is still needed until its window has passed, and a consumer of
//! the second knows nothing of it.

use worker::{Result, SqlStorage};

/// The object that keeps the registry.
pub(crate) const OBJECT: &str = "bq-dedupe/layouts";

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS layouts (
    layout TEXT PRIMARY KEY NOT NULL,
    since INTEGER NOT NULL
) WITHOUT ROWID";

/// A consumer configured with `current` and `previous` (the settings' own
/// text; `None`: `DEDUPE_PREVIOUS_SHARDS` unset) starts at `now`: `Ok(rows to
/// add)` (the layouts first seen now) or `Err(why it is refused)`. `history`:
/// the registry, oldest first. `window_ms`: the dedupe window (`None`: forever).
pub(crate) fn decide(
    history: &[(String, i64)],
    current: &str,
    previous: Option<&str>,
    window_ms: Option<u64>,
    now: i64,
) -> std::result::Result<Vec<(String, i64)>, String> {
    let Some(previous) = previous else {
        return not_resharding(history, current, window_ms, now);
    };
    let Some((last, since)) = history.last() else {
        // The first reshard seen: the layout before it is from "always".
        return Ok(vec![(previous.to_string(), 0), (current.to_string(), now)]);
    };
    if last == current {
        return Ok(Vec::new()); // this reshard, already registered
    }
    if last != previous {
        if history.iter().any(|(layout, _)| layout == current) {
            return Ok(Vec::new()); // a consumer of a layout before: not a new reshard
        }
        return Err(format!(
            "DEDUPE_PREVIOUS_SHARDS={previous} but the layout in use is DEDUPE_SHARDS={last}: \
             set DEDUPE_PREVIOUS_SHARDS={last} to reshard from it"
        ));
    }
    // A reshard from `last`, which was itself the target of one at `since`
    // (a registry of one layout has no reshard before it).
    if let [.., (before, _), _] = history {
        if before == current {
            // Back to the layout before: the ids of both are still asked.
            return Ok(vec![(current.to_string(), now)]);
        }
        let until = until(*since, window_ms);
        if until.is_none_or(|until| now < until) {
            let when = when(until);
            return Err(format!(
                "DEDUPE_SHARDS={current} with DEDUPE_PREVIOUS_SHARDS={previous}: a second reshard \
                 inside one dedupe window (DEDUPE_TTL_SECONDS). The reshard to {last} began at \
                 {since} ms since the epoch and still needs the layout before it ({before}) \
                 asked {when}; keep DEDUPE_SHARDS={last} and DEDUPE_PREVIOUS_SHARDS={before} until \
                 then"
            ));
        }
    }
    Ok(vec![(current.to_string(), now)])
}

/// [`decide`] for a consumer with no previous layout: its layout is registered
/// (from "always") the first time; it is refused while a reshard to it still
/// needs the layout before it (`DEDUPE_PREVIOUS_SHARDS` dropped inside the
/// window: every moved id would be forgotten), and whenever it is not the
/// layout in use (`DEDUPE_SHARDS` changed, or rolled back, without
/// `DEDUPE_PREVIOUS_SHARDS` naming the layout in use: the ids written there
/// would be forgotten). A refused consumer's messages are retried, so an old
/// isolate still running through a deploy hands them to the new ones.
fn not_resharding(
    history: &[(String, i64)],
    current: &str,
    window_ms: Option<u64>,
    now: i64,
) -> std::result::Result<Vec<(String, i64)>, String> {
    let Some((last, since)) = history.last() else {
        return Ok(vec![(current.to_string(), 0)]);
    };
    if last != current {
        return Err(format!(
            "DEDUPE_SHARDS={current} without DEDUPE_PREVIOUS_SHARDS, but the layout in use is \
             DEDUPE_SHARDS={last}: every id it holds would be forgotten; set \
             DEDUPE_PREVIOUS_SHARDS={last} to reshard from it"
        ));
    }
    let [.., (before, _), _] = history else {
        return Ok(Vec::new()); // never resharded
    };
    match until(*since, window_ms) {
        Some(until) if now >= until => Ok(Vec::new()),
        until => Err(format!(
            "DEDUPE_SHARDS={current} without DEDUPE_PREVIOUS_SHARDS, but the reshard to it \
             began at {since} ms since the epoch and still needs the layout before it \
             ({before}) asked {}: keep DEDUPE_PREVIOUS_SHARDS={before} until then",
            when(until)
        )),
    }
}

/// When a reshard that began at `since` no longer needs the layout before it.
fn until(since: i64, window_ms: Option<u64>) -> Option<i64> {
    window_ms.map(|w| since.saturating_add(w.min(i64::MAX as u64) as i64))
}

/// [`until`] in words.
fn when(until: Option<i64>) -> String {
    match until {
        Some(until) => format!("until {until} ms since the epoch"),
        None => "for as long as its ids matter (DEDUPE_TTL_SECONDS=forever)".into(),
    }
}

/// [`decide`] on the registry's table, writing what it adds.
pub(crate) fn check(
    sql: &SqlStorage,
    current: &str,
    previous: Option<&str>,
    window_ms: Option<u64>,
    now: i64,
) -> Result<Option<String>> {
    #[derive(serde::Deserialize)]
    struct Row {
        layout: String,
        since: i64,
    }
    sql.exec(SCHEMA, None)?;
    let rows: Vec<Row> = sql
        .exec(
            "SELECT layout, since FROM layouts ORDER BY since, layout",
            None,
        )?
        .to_array()?;
    let history: Vec<(String, i64)> = rows.into_iter().map(|r| (r.layout, r.since)).collect();
    match decide(&history, current, previous, window_ms, now) {
        Ok(added) => {
            for (layout, since) in added {
                sql.exec(
                    "INSERT OR REPLACE INTO layouts (layout, since) VALUES (?, ?)",
                    vec![layout.into(), (since as f64).into()],
                )?;
            }
            Ok(None)
        }
        Err(refused) => Ok(Some(refused)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: u64 = 86_400_000;

    fn h(rows: &[(&str, i64)]) -> Vec<(String, i64)> {
        rows.iter().map(|(l, s)| (l.to_string(), *s)).collect()
    }

    #[test]
    fn the_first_reshard_is_registered_with_the_layout_before_it() {
        let added = decide(&[], "4", Some("1"), Some(DAY), 1_000).unwrap();
        assert_eq!(added, h(&[("1", 0), ("4", 1_000)]));
        assert_eq!(
            decide(
                &h(&[("1", 0), ("4", 1_000)]),
                "4",
                Some("1"),
                Some(DAY),
                5_000
            ),
            Ok(vec![])
        );
    }

    #[test]
    fn a_second_reshard_inside_the_window_is_refused_naming_the_settings() {
        let history = h(&[("1", 0), ("4", 1_000)]);
        let refused = decide(&history, "8", Some("4"), Some(DAY), 2_000).unwrap_err();
        for named in [
            "DEDUPE_PREVIOUS_SHARDS=1",
            "DEDUPE_SHARDS=4",
            "DEDUPE_TTL_SECONDS",
        ] {
            assert!(refused.contains(named), "{refused}");
        }
        assert!(
            decide(&history, "8", Some("4"), None, i64::MAX).is_err(),
            "forever: never"
        );
        // After the window it is a reshard like the first.
        let after = 1_000 + DAY as i64;
        assert_eq!(
            decide(&history, "8", Some("4"), Some(DAY), after),
            Ok(h(&[("8", after)]))
        );
    }

    #[test]
    fn a_previous_setting_that_is_not_the_layout_in_use_is_refused() {
        let history = h(&[("1", 0), ("4", 1_000)]);
        let refused = decide(&history, "8", Some("2"), Some(DAY), 2_000).unwrap_err();
        assert!(
            refused.contains("set DEDUPE_PREVIOUS_SHARDS=4"),
            "{refused}"
        );
        // Back to the layout before, inside the window: both are still asked.
        assert_eq!(
            decide(&history, "1", Some("4"), Some(DAY), 2_000),
            Ok(h(&[("1", 2_000)]))
        );
        // A consumer configured for a layout of the registry with a previous
        // that is not the one in use (a stale deploy) is not a new reshard.
        assert_eq!(
            decide(&history, "1", Some("2"), Some(DAY), 2_000),
            Ok(vec![])
        );
    }

    /// Issue #25, finding 5: a consumer without `DEDUPE_PREVIOUS_SHARDS` was
    /// never checked, so dropping it inside the window forgot every moved id.
    #[test]
    fn dropping_the_previous_layout_inside_the_window_is_refused() {
        // Never resharded: the layout is registered once, then accepted.
        assert_eq!(decide(&[], "4", None, Some(DAY), 1_000), Ok(h(&[("4", 0)])));
        assert_eq!(
            decide(&h(&[("4", 0)]), "4", None, Some(DAY), 9_000),
            Ok(vec![])
        );
        let history = h(&[("1", 0), ("4", 1_000)]);
        let refused = decide(&history, "4", None, Some(DAY), 2_000).unwrap_err();
        for named in ["DEDUPE_PREVIOUS_SHARDS=1", "until 86401000"] {
            assert!(refused.contains(named), "{refused}");
        }
        assert!(
            decide(&history, "4", None, None, i64::MAX).is_err(),
            "forever: never"
        );
        let after = 1_000 + DAY as i64;
        assert_eq!(decide(&history, "4", None, Some(DAY), after), Ok(vec![]));
        // Back to the layout before without naming the one in use: the ids
        // written in 4 would be forgotten (found by review).
        let refused = decide(&history, "1", None, Some(DAY), 2 * DAY as i64).unwrap_err();
        assert!(
            refused.contains("set DEDUPE_PREVIOUS_SHARDS=4"),
            "{refused}"
        );
    }

    #[test]
    fn changing_the_shards_without_the_previous_layout_is_refused() {
        let refused = decide(&h(&[("4", 0)]), "8", None, Some(DAY), 2_000).unwrap_err();
        assert!(
            refused.contains("set DEDUPE_PREVIOUS_SHARDS=4"),
            "{refused}"
        );
        // Long after: still refused (the ids of 4 were written until now).
        assert!(decide(&h(&[("4", 0)]), "8", None, Some(DAY), i64::MAX).is_err());
        // Done the documented way, it is a first reshard.
        assert_eq!(
            decide(&h(&[("4", 0)]), "8", Some("4"), Some(DAY), 2_000),
            Ok(h(&[("8", 2_000)]))
        );
    }
}
