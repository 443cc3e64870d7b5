//! The compiled component is cached between runs (src/compile_cache.rs): the
//! first run writes it, later runs load it without writing, a damaged entry (one
//! flipped bit included) is compiled and written afresh, and `BQ_DEDUPE_CACHE=off`
//! writes nothing. Every run gives the same verdicts.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::SystemTime;

use common::{decisions, scratch};

const LINES: &str = concat!(
    r#"{"job":"urn:babel:orders:created","trace_id":"t-1","data":{},"meta":{"id":"c-1","schema_version":1}}"#,
    "\n",
    r#"{"job":"urn:babel:orders:created","trace_id":"t-1","data":{},"meta":{"id":"c-1","schema_version":1}}"#,
    "\n",
    "not json\n",
);

/// `bq-dedupe run --store memory` on `LINES`, its cache in `cache` (or off).
fn run(cache: &Path, off: bool) -> Output {
    let mut cmd = common::command();
    cmd.args(["run", "--store", "memory"])
        .env("BQ_DEDUPE_CACHE_DIR", cache)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if off {
        cmd.env("BQ_DEDUPE_CACHE", "off");
    } else {
        cmd.env_remove("BQ_DEDUPE_CACHE");
    }
    let mut child = cmd.spawn().expect("bq-dedupe starts");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(LINES.as_bytes()).unwrap();
    drop(stdin);
    child.wait_with_output().unwrap()
}

fn outcomes(out: &Output) -> Vec<String> {
    decisions(out)
        .iter()
        .map(|v| v["outcome"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// The compiled entries of the cache in `cache` (`*.cwasm`), with when each was
/// last written.
fn entries(cache: &Path) -> Vec<(PathBuf, SystemTime)> {
    let mut found = Vec::new();
    let Ok(listing) = std::fs::read_dir(cache) else {
        return found;
    };
    for entry in listing.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "cwasm") {
            let written = entry.metadata().unwrap().modified().unwrap();
            found.push((path, written));
        }
    }
    found.sort();
    found
}

#[test]
fn the_first_run_writes_the_cache_and_later_runs_load_it() {
    let cache = scratch("compile-cache").join("cache");
    let first = run(&cache, false);
    let expected = outcomes(&first);
    assert_eq!(expected, ["run-ok", "skip", "rejected"]);
    let written = entries(&cache);
    assert!(
        !written.is_empty(),
        "the first run cached its compiled component in {}",
        cache.display()
    );

    // A hit writes nothing: the entries are as the first run left them.
    let second = run(&cache, false);
    assert_eq!(outcomes(&second), expected);
    assert_eq!(second.status.code(), first.status.code());
    assert_eq!(
        entries(&cache),
        written,
        "the second run loaded, not compiled"
    );

    // One flipped bit is not trusted either (wasmtime's own cache ran such an
    // entry: messages twice, a hang, a crash, on every later run: a review's
    // finding): the run compiles, answers, and writes the entry anew.
    for (file, _) in &written {
        let mut entry = std::fs::read(file).unwrap();
        let middle = entry.len() / 2;
        entry[middle] ^= 0x04;
        std::fs::write(file, &entry).unwrap();
        let flipped = run(&cache, false);
        assert_eq!(outcomes(&flipped), expected);
        assert_ne!(std::fs::read(file).unwrap(), entry, "written afresh");
    }

    // A damaged entry is not trusted: the run compiles, answers, and writes it anew.
    for (file, _) in &written {
        std::fs::write(file, b"not a compiled component").unwrap();
    }
    let damaged = run(&cache, false);
    assert_eq!(outcomes(&damaged), expected);
    assert_eq!(damaged.status.code(), first.status.code());
    for (file, _) in &written {
        assert_ne!(
            std::fs::read(file).unwrap(),
            b"not a compiled component",
            "{} was written afresh",
            file.display()
        );
    }
}

#[test]
fn cache_off_writes_nothing_and_an_unusable_directory_is_reported_not_fatal() {
    let dir = scratch("compile-cache-off");
    let cache = dir.join("cache");
    let off = run(&cache, true);
    assert_eq!(outcomes(&off), ["run-ok", "skip", "rejected"]);
    assert!(
        entries(&cache).is_empty(),
        "BQ_DEDUPE_CACHE=off cached nothing"
    );

    // A file where the directory should be: the run compiles and says why.
    let blocked = dir.join("blocked");
    std::fs::write(&blocked, b"a file, not a directory").unwrap();
    let out = run(&blocked, false);
    assert_eq!(outcomes(&out), ["run-ok", "skip", "rejected"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("compilation cache off"),
        "the unusable cache directory is reported: {stderr}"
    );
}
