//! What a run keeps bounded (issue #29 item 6): expired ids purged (`bq-dedupe
//! purge`, and on a schedule inside `run`) without touching live claims; a
//! line's bytes read only up to the envelope limit; durations that would
//! overflow refused as arguments.

mod common;

use std::io::Write;
use std::time::Duration;

use bq_dedupe::{Store, block_on_ready, store::Claim};
use bq_dedupe_stores::SqliteStore;
use common::*;
use serde_json::Value;

fn envelope(id: &str) -> String {
    format!(
        r#"{{"job":"urn:babel:orders:created","trace_id":"t","data":{{}},"meta":{{"id":"{id}","schema_version":1}}}}"#
    )
}

fn json(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"))
}

/// `purge` deletes expired ids and keeps a live claim (and a live id).
#[test]
fn purge_deletes_expired_ids_and_keeps_live_claims() {
    let dir = scratch("purge");
    let spec = format!("sqlite:{}", dir.join("seen.db").display());
    let input = [envelope("short-1"), envelope("short-2")].join("\n");
    let out = bq(&["run", "--store", &spec, "--ttl", "1s"], &input);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    bq(&["run", "--store", &spec], &envelope("forever-1"));
    let store = SqliteStore::open(dir.join("seen.db")).unwrap();
    let claim = block_on_ready(store.claim("in-flight", Duration::from_secs(600)))
        .unwrap()
        .unwrap();
    assert!(matches!(claim, Claim::Acquired(_)));
    std::thread::sleep(Duration::from_millis(2100));
    let purged = bq(&["purge", "--store", &spec], "");
    assert_eq!(json(&purged)["purged"], 2, "{purged:?}");
    let stats = json(&bq(&["stats", "--store", &spec], ""));
    assert_eq!(stats["remembered"], 1, "{stats}");
    assert_eq!(stats["claimed"], 1, "the live claim stays: {stats}");
    let again = block_on_ready(store.claim("in-flight", Duration::from_secs(600)))
        .unwrap()
        .unwrap();
    assert_eq!(again, Claim::Held);
}

/// `run --purge-every` purges while it runs: ids that expired during a long
/// run are gone before it ends. (Paced by the run's verdicts: fixed sleeps
/// raced its start on a loaded machine, a review.)
#[test]
fn a_long_run_purges_expired_ids_on_its_schedule() {
    let dir = scratch("purge-run");
    let spec = format!("sqlite:{}", dir.join("seen.db").display());
    let mut child = spawn(&[
        "run",
        "--store",
        &spec,
        "--ttl",
        "1s",
        "--purge-every",
        "1s",
        "--batch",
        "1",
    ]);
    let mut stdin = child.stdin.take().unwrap();
    let verdicts = verdict_lines(child.stdout.take().unwrap());
    let next = || (verdicts.recv_timeout(Duration::from_secs(60))).expect("a verdict within 60 s");
    for i in 0..5 {
        writeln!(stdin, "{}", envelope(&format!("early-{i}"))).unwrap();
    }
    stdin.flush().unwrap();
    let early: Vec<String> = (0..5).map(|_| next()).collect();
    // Past their TTL and past the purge's due time.
    std::thread::sleep(Duration::from_millis(1500));
    // A line after the purge is due wakes the run, which purges.
    writeln!(stdin, "{}", envelope("late-1")).unwrap();
    stdin.flush().unwrap();
    let late = next();
    // The purge, once the run has read the line, while it still runs.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let stats = loop {
        let stats = json(&bq(&["stats", "--store", &spec], ""));
        if stats["expired"] == 0 || std::time::Instant::now() > deadline {
            break stats;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    for line in early.iter().chain([&late]) {
        let verdict: Value = serde_json::from_str(line).unwrap();
        assert_eq!(verdict["decision"], "run", "{line}");
    }
    assert_eq!(
        stats["expired"], 0,
        "expired ids left in the store: {stats}"
    );
    assert_eq!(stats["remembered"], 1, "{stats}");
}

/// Each line `stdout` prints, as it comes.
fn verdict_lines(stdout: std::process::ChildStdout) -> std::sync::mpsc::Receiver<String> {
    let (line, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for read in std::io::BufReader::new(stdout).lines() {
            let Ok(read) = read else { break };
            if line.send(read).is_err() {
                break;
            }
        }
    });
    lines
}

/// A 200 MB line without a newline took the host to 403 MB: only the first
/// MiB is read, the rest skipped; the line is rejected as too large and the
/// next one runs.
#[test]
fn an_endless_line_is_rejected_without_reading_it_into_memory() {
    let mut child = spawn(&["run", "--store", "memory"]);
    let mut stdin = child.stdin.take().unwrap();
    let feeder = std::thread::spawn(move || {
        let chunk = vec![b'x'; 1 << 20];
        for _ in 0..200 {
            stdin.write_all(&chunk).unwrap();
        }
        writeln!(stdin).unwrap();
        writeln!(stdin, "{}", envelope("after-1")).unwrap();
    });
    let (out, peak_kb) = wait_with_peak_kb(child);
    feeder.join().unwrap();
    let verdicts = decisions(&out);
    assert_eq!(verdicts.len(), 2, "{out:?}");
    assert_eq!(verdicts[0]["decision"], "reject", "{}", verdicts[0]);
    // Its whole size, not the MiB and a byte that was read of it.
    assert_eq!(
        verdicts[0]["reason"],
        format!(
            "the envelope is {} bytes, over the 1048576-byte limit",
            200 << 20
        ),
        "{}",
        verdicts[0]
    );
    assert_eq!(verdicts[1]["decision"], "run", "{}", verdicts[1]);
    assert!(
        peak_kb > 0 && peak_kb < 150_000,
        "the host grew to {peak_kb} kB on one line"
    );
}

/// `check` says a too-large line's whole size too, and numbers the lines after it.
#[test]
fn check_gives_a_cut_lines_whole_size() {
    let huge = format!("{{\"job\":\"j\",\"data\":\"{}\"}}", "x".repeat(3 << 20));
    let out = bq(
        &["check", "-"],
        &format!("{huge}\n{}\n", envelope("after-2")),
    );
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{out:?}");
    assert_eq!(lines[0]["code"], "too-large");
    assert_eq!(
        lines[0]["reason"],
        format!(
            "the envelope is {} bytes, over the 1048576-byte limit",
            huge.len()
        )
    );
    assert_eq!(
        (lines[1]["line"].as_u64(), lines[1]["valid"].as_bool()),
        (Some(2), Some(true))
    );
}

/// `--ttl 18446744073709552s` wrapped to a 384 ms window: now an argument error.
#[test]
fn a_duration_that_overflows_is_an_argument_error() {
    for flag in [
        "--ttl",
        "--lease",
        "--window",
        "--handler-timeout",
        "--purge-every",
    ] {
        let out = bq(
            &["run", "--store", "memory", flag, "18446744073709552s"],
            "",
        );
        assert_eq!(out.status.code(), Some(2), "{flag}: {out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("too long"),
            "{flag}: {out:?}"
        );
    }
}

/// Zero is not a TTL, a lease nor a handler timeout (every id forgotten at
/// once, every duplicate run beside the first, every delivery failed): an
/// argument error. A store that does not exist is not an
/// empty one for `stats`, `purge` and `forget` (a mistyped path created an
/// empty file).
#[test]
fn zero_durations_and_missing_stores_are_refused() {
    for flag in ["--ttl", "--lease", "--handler-timeout"] {
        let out = bq(&["run", "--store", "memory", flag, "0s"], "");
        assert_eq!(out.status.code(), Some(2), "{flag}: {out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("more than zero"),
            "{flag}: {out:?}"
        );
    }
    let dir = scratch("missing");
    let missing = dir.join("typo").join("seen.db");
    let spec = format!("sqlite:{}", missing.display());
    for args in [
        vec!["stats", "--store", &spec],
        vec!["purge", "--store", &spec],
        vec!["forget", "--store", &spec, "x"],
    ] {
        let out = bq(&args, "");
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("no such SQLite file"),
            "{out:?}"
        );
        assert!(
            !missing.exists() && !dir.join("typo").exists(),
            "{args:?} created it"
        );
    }
}

/// A run purges at its start too: a short run from cron would otherwise never
/// reach its first interval.
#[test]
fn a_run_purges_at_its_start() {
    let dir = scratch("purge-start");
    let spec = format!("sqlite:{}", dir.join("seen.db").display());
    let input = [envelope("old-1"), envelope("old-2")].join("\n");
    bq(&["run", "--store", &spec, "--ttl", "1s"], &input);
    std::thread::sleep(Duration::from_millis(2100));
    let out = bq(&["run", "--store", &spec], &envelope("new-1"));
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let stats = json(&bq(&["stats", "--store", &spec], ""));
    assert_eq!(stats["expired"], 0, "{stats}");
    assert_eq!(stats["remembered"], 1, "{stats}");
}

/// A line cut at the limit is not trimmed back under it (review): a 1 MiB
/// envelope followed by `\rGARBAGE` on the same line is rejected, not accepted
/// without what followed it.
#[test]
fn a_cut_line_is_never_trimmed_under_the_limit() {
    let pad = (1 << 20) - envelope("cut-1").len() - 20;
    let body = format!(
        r#"{{"job":"urn:babel:orders:created","trace_id":"t","data":{{"p":"{}"}},"meta":{{"id":"cut-1","schema_version":1}}}}"#,
        "x".repeat(pad)
    );
    let body = format!("{body}{}", " ".repeat((1 << 20) - body.len()));
    assert_eq!(body.len(), 1 << 20);
    let out = bq(
        &["run", "--store", "memory"],
        &format!("{body}\rGARBAGE\n{}\n", envelope("next-1")),
    );
    let verdicts = decisions(&out);
    assert_eq!(verdicts.len(), 2, "{out:?}");
    assert_eq!(
        verdicts[0]["decision"], "reject",
        "{}",
        verdicts[0]["reason"]
    );
    assert_eq!(verdicts[1]["decision"], "run");
}

/// A line of exactly the limit ending in `\r\n` was read as cut and rejected
/// (the same line ending in `\n` ran); a cut line's `\r\n` is not counted in
/// its size; a cut line that starts blank got no verdict at all from `run`.
#[test]
fn crlf_at_the_limit_runs_and_a_cut_line_is_never_dropped() {
    let limit = 1 << 20;
    let at_limit = |id: &str| {
        let body = envelope(id);
        let body = body.replacen('{', &format!("{{{}", " ".repeat(limit - body.len())), 1);
        assert_eq!(body.len(), limit);
        body
    };
    let over = format!("{}{}", " ".repeat(limit + 10), envelope("spaces-first"));
    let input = format!(
        "{}\r\n{over}\r\n{}x\r\n{}\n",
        at_limit("crlf-1"),
        at_limit("crlf-2"),
        envelope("after-3")
    );
    let out = bq(&["run", "--store", "memory"], &input);
    let verdicts = decisions(&out);
    let seen: Vec<(u64, String)> = verdicts
        .iter()
        .map(|v| {
            (
                v["line"].as_u64().unwrap(),
                v["decision"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (1, "run".into()),
            (2, "reject".into()),
            (3, "reject".into()),
            (4, "run".into())
        ],
        "{verdicts:?}"
    );
    assert_eq!(
        verdicts[1]["reason"],
        format!(
            "the envelope is {} bytes, over the 1048576-byte limit",
            over.len()
        )
    );
    assert_eq!(
        verdicts[2]["reason"],
        format!(
            "the envelope is {} bytes, over the 1048576-byte limit",
            limit + 1
        )
    );
}
