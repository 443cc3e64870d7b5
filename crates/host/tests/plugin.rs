//! `bq-dedupe run --handler PLUGIN.wasm`: handler plugins are components that
//! export the WIT `handler` interface. These three are written in WAT so the test
//! needs no second toolchain: one succeeds, one fails with a message, one traps.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

mod common;

/// A handler component whose `handle` answers with `body` (a core-wasm
/// instruction sequence leaving a pointer to the `result<_, string>` on the stack).
fn plugin(body: &str) -> String {
    format!(
        r#"(component
  (core module $m
    (memory (export "memory") 17)
    (global $next (mut i32) (i32.const 4096))
    ;; A bump allocator: each call starts again from 4096.
    (func (export "realloc") (param i32 i32 i32 i32) (result i32)
      (local $p i32)
      (local.set $p (i32.and (i32.add (global.get $next) (i32.const 7)) (i32.const -8)))
      (global.set $next (i32.add (local.get $p) (local.get 3)))
      (local.get $p))
    (data (i32.const 64) "plugin says no")
    (func (export "handle") (param i32 i32) (result i32)
      (global.set $next (i32.const 4096))
      {body}))
  (core instance $i (instantiate $m))
  (func $handle (param "envelope" string) (result (result (error string)))
    (canon lift (core func $i "handle") (memory (core memory $i "memory")) (realloc (core func $i "realloc"))))
  (instance $iface (export "handle" (func $handle)))
  (export "babelqueue:idempotency/handler@1.0.0" (instance $iface)))"#
    )
}

const OK: &str = "(i32.store8 (i32.const 16) (i32.const 0)) (i32.const 16)";
const FAIL: &str = "(i32.store8 (i32.const 16) (i32.const 1)) (i32.store (i32.const 20) (i32.const 64)) (i32.store (i32.const 24) (i32.const 14)) (i32.const 16)";
const TRAP: &str = "unreachable";

fn write_plugin(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(format!("{name}.wasm"));
    std::fs::write(
        &path,
        wat::parse_str(plugin(body)).expect("valid WAT component"),
    )
    .unwrap();
    path
}

fn run(store: &str, plugin: &Path, input: &str) -> Vec<Value> {
    run_with(store, plugin, &[], input)
}

/// `bq-dedupe run --handler PLUGIN` (and `extra` flags) over `input`: its
/// verdicts, after checking that it printed verdicts (exit 0 or 3), not an error.
fn run_with(store: &str, plugin: &Path, extra: &[&str], input: &str) -> Vec<Value> {
    let mut args = vec![
        "run",
        "--store",
        store,
        "--handler",
        plugin.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let mut child = common::spawn(&args);
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        matches!(out.status.code(), Some(0 | 3)),
        "verdicts, not an error: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A directory of this test process's own under target/host-tests.
fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!(
        "../../target/host-tests/{name}-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn envelope(id: &str) -> String {
    json!({"job": "urn:babel:x", "trace_id": "t", "data": {}, "meta": {"id": id, "schema_version": 1}, "attempts": 0})
        .to_string()
}

#[test]
fn plugin_results_drive_the_decisions() {
    let dir = scratch("plugin");
    let store = format!("sqlite:{}", dir.join("seen.db").display());
    let (ok, fail, trap) = (
        write_plugin(&dir, "ok", OK),
        write_plugin(&dir, "fail", FAIL),
        write_plugin(&dir, "trap", TRAP),
    );
    let input = [envelope("p1"), envelope("p2")].join("\n");

    // A failing plugin: failed with its message, nothing remembered.
    let failed = run(&store, &fail, &input);
    assert!(
        failed
            .iter()
            .all(|d| d["decision"] == "failed" && d["reason"] == "plugin says no"),
        "{failed:?}"
    );
    // A trapping plugin: failed, and the stream goes on (the instance is replaced).
    let trapped = run(&store, &trap, &input);
    assert!(
        trapped.iter().all(|d| d["decision"] == "failed"),
        "{trapped:?}"
    );
    assert!(
        trapped[0]["reason"].as_str().unwrap().contains("trapped"),
        "{trapped:?}"
    );
    // A succeeding plugin runs both (they were never remembered), then skips them.
    let ran = run(&store, &ok, &(input.clone() + "\n" + &input));
    let kinds: Vec<&str> = ran
        .iter()
        .map(|d| d["decision"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["run", "run", "skip", "skip"]);
}

/// A plugin that never returns hung `bq-dedupe run` for good: now each call is
/// stopped at `--handler-timeout`, the delivery `failed` (retried), and the
/// stream goes on with a fresh instance.
#[test]
fn a_plugin_that_never_returns_is_stopped_at_the_handler_timeout() {
    let dir = scratch("plugin-loop");
    let spin = write_plugin(&dir, "spin", "(loop $forever (br $forever)) (i32.const 16)");
    let started = std::time::Instant::now();
    let input = [envelope("s1"), envelope("s2")].join("\n");
    let verdicts = run_with("memory", &spin, &["--handler-timeout", "300ms"], &input);
    let elapsed = started.elapsed();
    assert_eq!(verdicts.len(), 2, "{verdicts:?}");
    for v in &verdicts {
        assert_eq!(v["decision"], "failed", "{v}");
        assert_eq!(
            v["reason"], "handler plugin ran past --handler-timeout (300ms) and was stopped",
            "{v}"
        );
    }
    assert!(elapsed < std::time::Duration::from_secs(30), "{elapsed:?}");
    std::fs::remove_dir_all(&dir).ok();
}

/// A plugin failing with a 64 MiB message: its delivery is `run-failed` with
/// the message's start, and the rest of the batch is decided. The whole string
/// went into the dedupe component, which trapped copying it, and every line
/// of the batch was a `failed` trap (a review's finding).
#[test]
fn a_huge_error_message_is_cut_not_a_trap_of_the_batch() {
    let dir = scratch("plugin-huge-error");
    let store = format!("sqlite:{}", dir.join("seen.db").display());
    const HUGE: &str = "(drop (memory.grow (i32.const 1088))) (i32.store8 (i32.const 16) (i32.const 1)) \
        (i32.store (i32.const 20) (i32.const 2097152)) (i32.store (i32.const 24) (i32.const 67108864)) \
        (i32.const 16)";
    let huge = write_plugin(&dir, "huge", HUGE);
    let verdicts = run(&store, &huge, &format!("{}\n", envelope("h-1")));
    assert_eq!(verdicts.len(), 1);
    assert_eq!(
        verdicts[0]["outcome"], "run-failed",
        "{:?}",
        verdicts[0]["reason"]
    );
    let reason = verdicts[0]["reason"].as_str().unwrap_or_default();
    assert!(reason.len() < 10_000, "a reason of {} bytes", reason.len());
    assert!(
        reason.contains("67108864 bytes"),
        "it says how long it was: {reason:.200}"
    );
}
