//! The compiled component is cached between runs (wasmtime's cache): the first
//! run writes it, later runs load it, a damaged entry is compiled afresh, and
//! `BQ_DEDUPE_CACHE=off` writes nothing. Every run gives the same verdicts.

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::{BIN, scratch};

const LINES: &str = concat!(
    r#"{"job":"urn:babel:orders:created","trace_id":"t-1","data":{},"meta":{"id":"c-1","schema_version":1}}"#,
    "\n",
    r#"{"job":"urn:babel:orders:created","trace_id":"t-1","data":{},"meta":{"id":"c-1","schema_version":1}}"#,
    "\n",
    "not json\n",
);

/// `bq-dedupe run --store memory` on `LINES` with the given cache settings.
fn run(env: &[(&str, &Path)], off: bool) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(["run", "--store", "memory"])
        .env_remove("BQ_DEDUPE_CACHE_DIR")
        .env_remove("BQ_DEDUPE_CACHE")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    if off {
        cmd.env("BQ_DEDUPE_CACHE", "off");
    }
    let mut child = cmd.spawn().expect("bq-dedupe starts");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(LINES.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// Every regular file under `dir`, recursively.
fn files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files(&path));
        } else {
            found.push(path);
        }
    }
    found
}

fn verdicts(out: &Output) -> Vec<String> {
    assert!(
        out.status.code().is_some(),
        "bq-dedupe was killed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("a JSON verdict");
            v["outcome"].as_str().unwrap_or_default().to_owned()
        })
        .collect()
}

#[test]
fn the_first_run_writes_the_cache_and_later_runs_give_the_same_verdicts() {
    let dir = scratch("compile-cache");
    let cache = dir.join("cache");
    let first = run(&[("BQ_DEDUPE_CACHE_DIR", &cache)], false);
    let expected = verdicts(&first);
    assert_eq!(expected, ["run-ok", "skip", "rejected"]);
    let written = files(&cache);
    assert!(
        !written.is_empty(),
        "the first run cached its compiled component in {}",
        cache.display()
    );

    let second = run(&[("BQ_DEDUPE_CACHE_DIR", &cache)], false);
    assert_eq!(verdicts(&second), expected);
    assert_eq!(second.status.code(), first.status.code());

    // A damaged entry is not trusted: the run compiles again and still answers.
    for file in &written {
        std::fs::write(file, b"not a compiled component").unwrap();
    }
    let damaged = run(&[("BQ_DEDUPE_CACHE_DIR", &cache)], false);
    assert_eq!(verdicts(&damaged), expected);
    assert_eq!(damaged.status.code(), first.status.code());
}

#[test]
fn cache_off_writes_nothing_and_an_unusable_directory_is_reported_not_fatal() {
    let dir = scratch("compile-cache-off");
    let cache = dir.join("cache");
    let off = run(&[("BQ_DEDUPE_CACHE_DIR", &cache)], true);
    assert_eq!(verdicts(&off), ["run-ok", "skip", "rejected"]);
    assert!(
        files(&cache).is_empty(),
        "BQ_DEDUPE_CACHE=off cached nothing"
    );

    // A file where the directory should be: the run compiles and says why.
    let blocked = dir.join("blocked");
    std::fs::write(&blocked, b"a file, not a directory").unwrap();
    let out = run(&[("BQ_DEDUPE_CACHE_DIR", &blocked)], false);
    assert_eq!(verdicts(&out), ["run-ok", "skip", "rejected"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("compilation cache off"),
        "the unusable cache directory is reported: {stderr}"
    );
}
