//! `bq-dedupe` end to end: the real binary, the real component, real SQLite files
//! and a real Redis (`BQ_TEST_REDIS_URL`, started by `make test`).

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

mod common;

use common::{BIN, bq, decisions, scratch};

/// The Redis `make test` starts. Missing means the run is misconfigured: fail,
/// never pass as skipped.
fn redis_url() -> Option<String> {
    Some(std::env::var("BQ_TEST_REDIS_URL").expect(
        "BQ_TEST_REDIS_URL is not set: run the Redis tests through make test \
         (scripts/with-redis.sh starts a real server)",
    ))
}

/// A Redis spec with a prefix of its own, so tests never see each other's keys.
fn redis_spec(url: &str, name: &str) -> String {
    format!("{url}?prefix=bq-test:{name}:{}:", std::process::id())
}

/// Every verdict printed before a kill is a `skip` in the rerun's verdicts:
/// what was printed had been recorded.
fn assert_skipped_on_rerun(printed: &[Value], rerun: &[Value]) {
    for d in printed {
        let n = d["line"].as_u64().unwrap() as usize;
        assert_eq!(
            rerun[n - 1]["decision"],
            "skip",
            "printed, then ran again: {d}"
        );
    }
}

fn envelope(id: &str) -> String {
    json!({
        "job": "urn:babel:orders:created", "trace_id": "7b3f9c2a-e41d-4f88-9b2a-1c0d5e6f7a8b",
        "data": {"order_id": 1042}, "attempts": 0,
        "meta": {"id": id, "queue": "orders", "lang": "php", "schema_version": 1, "created_at": 1749132727000u64}
    })
    .to_string()
}

fn conformance_passes(store: &str) {
    let out = bq(&["conformance", "--store", store], "");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("conformance against {store}:\n{stdout}");
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.lines().any(|l| l == "13 passed, 0 failed"),
        "{stdout}"
    );
}

#[test]
fn conformance_passes_against_memory() {
    conformance_passes("memory");
}

#[test]
fn conformance_passes_against_sqlite_twice_on_one_file() {
    let db = scratch("conformance-sqlite").join("seen.db");
    let spec = format!("sqlite:{}", db.display());
    conformance_passes(&spec);
    // Repeatable against a persistent store: each run starts from an empty namespace.
    conformance_passes(&spec);
}

#[test]
fn conformance_passes_against_redis() {
    if let Some(url) = redis_url() {
        let spec = redis_spec(&url, "conformance");
        conformance_passes(&spec);
        conformance_passes(&spec);
    }
}

#[test]
fn run_prints_one_decision_per_line_and_dedupes() {
    let db = scratch("run").join("seen.db");
    let spec = format!("sqlite:{}", db.display());
    let input = [
        envelope("a"),
        envelope("b"),
        envelope("a"),
        "not json".into(),
        envelope(""),
    ]
    .join("\n");
    let out = bq(&["run", "--store", &spec], &input);
    assert_eq!(
        out.status.code(),
        Some(4),
        "a poison line and no retry: exit 4"
    );
    let got: Vec<(String, Value)> = decisions(&out)
        .iter()
        .map(|d| (d["decision"].as_str().unwrap().to_owned(), d["id"].clone()))
        .collect();
    assert_eq!(
        got,
        vec![
            ("run".into(), json!("a")),
            ("run".into(), json!("b")),
            ("skip".into(), json!("a")),
            ("reject".into(), Value::Null),
            ("fail-open".into(), Value::Null),
        ]
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("summary: 5 lines"));
    // A fail-open line says why, as `check` does (its reason was null).
    let why = decisions(&out)[4]["reason"].as_str().map(str::to_owned);
    assert!(
        why.as_deref()
            .is_some_and(|r| r.contains("ran without dedupe")),
        "{why:?}"
    );
    // A second process on the same file sees what the first remembered.
    let again = bq(&["run", "--store", &spec], &envelope("b"));
    assert_eq!(decisions(&again)[0]["decision"], "skip");
}

#[test]
fn exec_handler_failure_leaves_the_id_for_the_retry() {
    let dir = scratch("exec");
    let spec = format!("sqlite:{}", dir.join("seen.db").display());
    let flag = dir.join("fail-once");
    std::fs::write(&flag, "").unwrap();
    // Fails while the flag file exists, and removes it: fails once, then succeeds.
    let cmd = format!(
        "if [ -e {0} ]; then rm {0}; echo boom >&2; exit 3; fi; cat > /dev/null",
        flag.display()
    );
    let input = [envelope("x"), envelope("x"), envelope("x")].join("\n");
    // One delivery per call: each redelivery of x is a new attempt.
    let out = bq(
        &["run", "--store", &spec, "--exec", &cmd, "--batch", "1"],
        &input,
    );
    assert_eq!(
        out.status.code(),
        Some(3),
        "a failed delivery needs a retry: exit 3"
    );
    let d = decisions(&out);
    assert_eq!(d[0]["decision"], "failed");
    assert!(
        d[0]["reason"].as_str().unwrap().contains("boom"),
        "{}",
        d[0]
    );
    assert_eq!(d[1]["decision"], "run");
    assert_eq!(d[2]["decision"], "skip");

    // Batched (the default): the same verdicts as one at a time. The copy after
    // the failed first one runs again, the next is a skip.
    let spec = format!("sqlite:{}", dir.join("batched.db").display());
    std::fs::write(&flag, "").unwrap();
    let out = bq(&["run", "--store", &spec, "--exec", &cmd], &input);
    assert_eq!(out.status.code(), Some(3));
    let d: Vec<Value> = decisions(&out)
        .iter()
        .map(|d| d["decision"].clone())
        .collect();
    assert_eq!(d, [json!("failed"), json!("run"), json!("skip")]);
    let again = bq(&["run", "--store", &spec, "--exec", &cmd], &input);
    let d: Vec<Value> = decisions(&again)
        .iter()
        .map(|d| d["decision"].clone())
        .collect();
    assert_eq!(d, [json!("skip"), json!("skip"), json!("skip")]);
}

/// 16 processes deliver the same id at the same moment, in claiming mode: the
/// handler (which appends to a file) runs exactly once.
fn claim_race(store: &str, dir: &Path) {
    let effects = dir.join("effects");
    let cmd = format!("sleep 0.3; echo ran >> {}", effects.display());
    let children: Vec<_> = (0..16)
        .map(|_| common::spawn(&["run", "--store", store, "--claim", "--exec", &cmd]))
        .collect();
    // Everyone is started before anyone gets its line.
    let body = envelope("contended-id") + "\n";
    let children: Vec<_> = children
        .into_iter()
        .map(|mut c| {
            c.stdin.take().unwrap().write_all(body.as_bytes()).unwrap();
            c
        })
        .collect();
    let mut kinds: Vec<String> = children
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().unwrap();
            assert!(
                matches!(out.status.code(), Some(0 | 3)),
                "run-ok or park, never an error: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            decisions(&out)[0]["decision"].as_str().unwrap().to_owned()
        })
        .collect();
    kinds.sort();
    let ran = std::fs::read_to_string(&effects)
        .unwrap_or_default()
        .lines()
        .count();
    println!("{store}: {kinds:?}");
    assert_eq!(ran, 1, "the handler must run exactly once: {kinds:?}");
    assert_eq!(kinds.iter().filter(|k| *k == "run").count(), 1, "{kinds:?}");
    assert!(
        kinds
            .iter()
            .all(|k| k == "run" || k == "park" || k == "skip"),
        "{kinds:?}"
    );
}

#[test]
fn sixteen_processes_claiming_one_id_on_sqlite_run_it_once() {
    let dir = scratch("race-sqlite");
    claim_race(&format!("sqlite:{}", dir.join("seen.db").display()), &dir);
}

#[test]
fn sixteen_processes_claiming_one_id_on_redis_run_it_once() {
    if let Some(url) = redis_url() {
        let dir = scratch("race-redis");
        claim_race(&redis_spec(&url, "race"), &dir);
    }
}

#[test]
fn kill_dash_nine_mid_stream_loses_nothing_and_reruns_nothing_reported() {
    let dir = scratch("crash");
    let spec = format!("sqlite:{}", dir.join("seen.db").display());
    let lines: Vec<String> = (0..3000).map(|i| envelope(&format!("crash-{i}"))).collect();
    let mut child = common::command()
        .args(["run", "--store", &spec])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let feed = lines.clone();
    // Feed slowly enough that the kill lands mid-stream.
    let feeder = std::thread::spawn(move || {
        for chunk in feed.chunks(100) {
            if stdin
                .write_all((chunk.join("\n") + "\n").as_bytes())
                .is_err()
            {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    });
    let mut reported = Vec::new();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while reported.len() < 700 && out.read_line(&mut line).unwrap() > 0 {
        let d: Value = serde_json::from_str(&line).unwrap();
        reported.push(d);
        line.clear();
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    feeder.join().unwrap();
    assert!(reported.len() >= 700);
    assert!(reported.iter().all(|d| d["decision"] == "run"));

    // Restart on the same file with the whole stream.
    let out = bq(&["run", "--store", &spec], &(lines.join("\n") + "\n"));
    let second = decisions(&out);
    assert_eq!(second.len(), lines.len(), "every line gets a decision");
    assert_skipped_on_rerun(&reported, &second);
    assert!(
        second
            .iter()
            .all(|d| d["decision"] == "run" || d["decision"] == "skip"),
        "no line is lost"
    );
}

fn hostile_lines() -> Vec<Vec<u8>> {
    let deep = format!(
        "{{\"job\":\"urn:x\",\"trace_id\":\"t\",\"meta\":{{\"id\":\"deep\",\"schema_version\":1}},\"data\":{{\"x\":{}1{}}}}}",
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    let mut big: Value = serde_json::from_str(&envelope("big")).unwrap();
    big["data"]["blob"] = "x".repeat(1_000_000).into();
    vec![
        b"not json at all".to_vec(),
        b"{\"job\":".to_vec(),
        b"\xff\xfe\x00garbage".to_vec(),
        big.to_string().into_bytes(),
        deep.into_bytes(),
        envelope(&"k".repeat(10 * 1024)).into_bytes(),
        envelope("ctl\u{0}\u{1}\u{1b}[31m\u{7f}").into_bytes(),
        envelope("'); DROP TABLE bq_dedupe; --").into_bytes(),
        envelope("*1\r\n$8\r\nFLUSHALL\r\n").into_bytes(),
        envelope("café ☕ 😀").into_bytes(),
        b"[]".to_vec(),
        b"null".to_vec(),
    ]
}

fn hostile_stream_gets_verdicts(store: &str) {
    let lines = hostile_lines();
    let mut input = Vec::new();
    for l in lines.iter().chain(lines.iter()) {
        input.extend_from_slice(l);
        input.push(b'\n');
    }
    let mut child = common::spawn(&["run", "--store", store]);
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || stdin.write_all(&input).unwrap());
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    assert!(
        matches!(out.status.code(), Some(0 | 3 | 4)),
        "verdicts, not an error: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let d = decisions(&out);
    assert_eq!(d.len(), 2 * lines.len(), "one verdict per line");
    let first: Vec<&str> = d[..lines.len()]
        .iter()
        .map(|d| d["decision"].as_str().unwrap())
        .collect();
    let second: Vec<&str> = d[lines.len()..]
        .iter()
        .map(|d| d["decision"].as_str().unwrap())
        .collect();
    assert_eq!(
        first,
        [
            "reject", "reject", "reject", "run", "reject", "run", "run", "run", "run", "run",
            "reject", "reject"
        ]
    );
    assert_eq!(
        second,
        [
            "reject", "reject", "reject", "skip", "reject", "skip", "skip", "skip", "skip", "skip",
            "reject", "reject"
        ]
    );
    assert!(
        d[4]["reason"]
            .as_str()
            .unwrap()
            .contains("levels deep or more"),
        "{}",
        d[4]
    );
}

#[test]
fn hostile_lines_each_get_a_verdict_on_sqlite() {
    let dir = scratch("hostile");
    hostile_stream_gets_verdicts(&format!("sqlite:{}", dir.join("seen.db").display()));
}

#[test]
fn hostile_lines_each_get_a_verdict_on_redis() {
    if let Some(url) = redis_url() {
        hostile_stream_gets_verdicts(&redis_spec(&url, "hostile"));
    }
}

#[test]
fn check_gives_one_verdict_per_fixture() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/conformance/fixtures");
    let mut input = String::new();
    for name in [
        "order-created",
        "urn-alias",
        "invalid-missing-urn",
        "invalid-unknown-schema-version",
    ] {
        let text = std::fs::read_to_string(fixtures.join(format!("{name}.json"))).unwrap();
        let compact: Value = serde_json::from_str(&text).unwrap();
        input.push_str(&(compact.to_string() + "\n"));
    }
    // Valid, but with no id to dedupe by: said, in run's words.
    input.push_str(r#"{"job":"urn:babel:orders:created","trace_id":"t","data":{},"meta":{"schema_version":1}}"#);
    input.push('\n');
    let out = bq(&["check"], &input);
    let d = decisions(&out);
    let valid: Vec<bool> = d.iter().map(|v| v["valid"].as_bool().unwrap()).collect();
    assert_eq!(valid, [true, true, false, false, true]);
    assert_eq!(d[2]["code"], "missing-job");
    // An invalid line's id where it can be read (as docs/cli.md shows).
    assert_eq!(
        d[2]["id"], "f1e2d3c4-b5a6-4789-90ab-cdef01234567",
        "{:?}",
        d[2]
    );
    assert_eq!(d[3]["code"], "unsupported-schema-version");
    assert_eq!(d[0].get("dedupe"), None, "{:?}", d[0]);
    assert_eq!(d[4]["dedupe"], false, "{:?}", d[4]);
    assert!(
        d[4]["reason"]
            .as_str()
            .unwrap()
            .contains("ran without dedupe"),
        "{:?}",
        d[4]
    );
    assert!(
        !out.status.success(),
        "invalid input makes check exit non-zero"
    );
    // With stdout a closed pipe (`| head -1`), println! panicked (exit 101).
    let file = scratch("check-epipe").join("in.jsonl");
    std::fs::write(&file, input.repeat(200)).unwrap();
    let status = with_stdout_closed(&["check", file.to_str().unwrap()]);
    assert_eq!(status.code(), Some(1), "check with stdout closed");
}

/// `bq-dedupe ARGS` with its stdout a pipe closed at once (`| head -0`).
fn with_stdout_closed(args: &[&str]) -> std::process::ExitStatus {
    let mut closed = common::command()
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(closed.stdout.take());
    closed.wait().unwrap()
}

/// An argument clap refuses that is not UTF-8: its usage error, exit 2, not a
/// panic (the masking of clap's errors read the arguments with `env::args`).
#[cfg(unix)]
#[test]
fn a_refused_argument_that_is_not_utf8_is_a_usage_error() {
    use std::os::unix::ffi::OsStrExt;
    let out = common::command()
        .arg("stats")
        .arg(std::ffi::OsStr::from_bytes(b"\xff"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("unexpected argument"));
}

/// A mistyped input file: an error, and no store created for it (the
/// default `.bq-dedupe/seen.db` appeared wherever `run` was started).
#[test]
fn run_on_a_missing_input_creates_no_store() {
    let dir = scratch("missing-input");
    let db = dir.join("sub").join("seen.db");
    let spec = format!("sqlite:{}", db.display());
    let missing = dir.join("no-such.jsonl");
    let out = bq(&["run", "--store", &spec, missing.to_str().unwrap()], "");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(!db.exists(), "no store for a run that read nothing");
}

#[test]
fn forget_and_stats_work_on_a_persistent_store() {
    let dir = scratch("admin");
    let spec = format!("sqlite:{}", dir.join("seen.db").display());
    let marked = bq(
        &["run", "--store", &spec],
        &[envelope("f1"), envelope("f2")].join("\n"),
    );
    // A run without a handler says that it marks without running.
    let said = String::from_utf8_lossy(&marked.stderr);
    assert!(
        said.contains("without running anything (a mark run)"),
        "{said}"
    );
    let stats = bq(&["stats", "--store", &spec], "");
    let s: Value = serde_json::from_slice(&stats.stdout).unwrap();
    assert_eq!(s["remembered"], 2);
    // What the store holds for each id, under the prefix given.
    let shown = bq(&["show", "--store", &spec, "f1", "nope"], "");
    let shown: Vec<Value> = String::from_utf8_lossy(&shown.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        shown[0],
        serde_json::json!({"id": "f1", "key": "f1", "state": "done"})
    );
    assert_eq!(shown[1]["state"], "free");
    let prefixed = bq(&["show", "--store", &spec, "--prefix", "p:", "f1"], "");
    assert!(String::from_utf8_lossy(&prefixed.stdout).contains(r#""key":"p:f1","state":"free""#));
    // Nothing to forget under another prefix: said, not hidden.
    let wrong = bq(&["forget", "--store", &spec, "--prefix", "p:", "f1"], "");
    assert!(wrong.status.success());
    assert!(wrong.stdout.is_empty(), "nothing said forgotten: {wrong:?}");
    let said = String::from_utf8_lossy(&wrong.stderr);
    assert!(
        said.contains(r#"f1 was not remembered (key "p:f1"): nothing to forget"#),
        "{said}"
    );
    // With stdout a closed pipe (`| head -1`), printing "forgot" panicked and
    // ended forget before its later ids: each id is still forgotten.
    bq(
        &["run", "--store", &spec],
        &[envelope("g1"), envelope("g2")].join("\n"),
    );
    let status = with_stdout_closed(&["forget", "--store", &spec, "g1", "g2"]);
    assert_eq!(status.code(), Some(0), "forget with stdout closed");
    let shown = bq(&["show", "--store", &spec, "g1", "g2"], "");
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert_eq!(shown.matches(r#""state":"free""#).count(), 2, "{shown}");
    let forgot = bq(&["forget", "--store", &spec, "f1"], "");
    assert!(forgot.status.success());
    assert!(
        forgot.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&forgot.stderr)
    );
    let out = bq(
        &["run", "--store", &spec],
        &[envelope("f1"), envelope("f2")].join("\n"),
    );
    let kinds: Vec<_> = decisions(&out)
        .iter()
        .map(|d| d["decision"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(kinds, ["run", "skip"]);
}

/// A script can tell from the status alone: 0 when every delivery is done, 3 when
/// any needs a retry, 4 when none does but some line was poison, 2 on an error
/// (5, a success that may repeat: `leases.rs` and the unit test of `exit_code`).
#[test]
fn run_exit_status_says_whether_anything_needs_a_retry() {
    let spec = format!("sqlite:{}", scratch("exit").join("seen.db").display());
    let ok = bq(
        &["run", "--store", &spec],
        &[envelope("e1"), envelope("e1")].join("\n"),
    );
    assert_eq!(ok.status.code(), Some(0), "run-ok then skip");
    let failed = bq(
        &["run", "--store", &spec, "--exec", "exit 1"],
        &envelope("e2"),
    );
    assert_eq!(failed.status.code(), Some(3));
    let poison = bq(&["run", "--store", &spec], "not json");
    assert_eq!(poison.status.code(), Some(4));
    let mixed = bq(
        &["run", "--store", &spec, "--exec", "exit 1"],
        &[envelope("e3"), "not json".into()].join("\n"),
    );
    assert_eq!(mixed.status.code(), Some(3), "a retry outranks poison");
    let error = bq(&["run", "--store", "nosuch:x"], "");
    assert_eq!(error.status.code(), Some(2));
}

/// The binary on its own, as `cargo install --path crates/host` leaves it: copied
/// out of the repository, run from a directory outside it, with no environment
/// pointing back. The component and the conformance manifest are built in.
#[test]
fn installed_binary_works_outside_the_repository_with_what_is_built_in() {
    let outside = std::env::temp_dir().join(format!("bq-dedupe-installed-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&outside);
    std::fs::create_dir_all(outside.join("bin")).unwrap();
    let bin = outside.join("bin/bq-dedupe");
    std::fs::copy(BIN, &bin).unwrap();
    // As an installed binary runs: no test settings, so the default compilation
    // cache (the user's) too.
    let run = |args: &[&str], stdin: &str| {
        let mut child = Command::new(&bin)
            .args(args)
            .current_dir(&outside)
            .env_remove("BQ_DEDUPE_COMPONENT")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    };
    let conformance = run(&["conformance", "--store", "memory"], "");
    let text = String::from_utf8_lossy(&conformance.stdout);
    assert!(
        conformance.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&conformance.stderr)
    );
    assert!(text.contains("13 passed, 0 failed"), "{text}");
    let input = [envelope("i-1"), envelope("i-1")].join("\n");
    let out = run(&["run"], &input);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let d = decisions(&out);
    assert_eq!(
        (d[0]["decision"].as_str(), d[1]["decision"].as_str()),
        (Some("run"), Some("skip"))
    );
    assert!(
        outside.join(".bq-dedupe/seen.db").exists(),
        "the embedded default store lives where it runs"
    );
    let _ = std::fs::remove_dir_all(&outside);
}

/// The verdicts a running `bq-dedupe run` prints, as they come, from a thread
/// reading its stdout (joined once stdout closes).
fn verdict_stream(
    child: &mut std::process::Child,
) -> (
    std::sync::mpsc::Receiver<Value>,
    std::thread::JoinHandle<()>,
) {
    let (send, verdicts) = std::sync::mpsc::channel::<Value>();
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let line = line.unwrap();
            let _ = send.send(serde_json::from_str(&line).unwrap());
        }
    });
    (verdicts, reader)
}

/// A complete line is decided within the window even while the next one has only
/// begun: the reader does not wait for the rest of a line it has partly read.
#[test]
fn run_decides_a_line_while_the_next_is_half_written() {
    let mut child = common::spawn(&["run", "--store", "memory", "--window", "20ms"]);
    let mut stdin = child.stdin.take().unwrap();
    let (verdicts, reader) = verdict_stream(&mut child);
    write!(stdin, "{}\n{{\"job\"", envelope("half-1")).unwrap();
    stdin.flush().unwrap();
    let first = verdicts
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("line 1's verdict while line 2 is half written");
    assert_eq!(first["line"], 1, "{first}");
    assert_eq!(first["decision"], "run", "{first}");
    // The rest of line 2 (an envelope without meta): decided at the end of input.
    writeln!(stdin, ":\"urn:babel:orders:created\"}}").unwrap();
    drop(stdin);
    let second = verdicts
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("line 2's verdict");
    assert_eq!(second["line"], 2, "{second}");
    assert_eq!(second["decision"], "reject", "{second}");
    child.wait().unwrap();
    reader.join().unwrap();
}

/// Batching is on by default, cut by a time window: a line on a stream that then
/// goes quiet gets its verdict promptly, long before the batch of 100 could fill
/// or stdin close, and every later line too, in order.
#[test]
fn run_batches_by_default_but_a_quiet_stream_gets_each_verdict_within_the_window() {
    let mut child = common::spawn(&["run", "--store", "memory", "--window", "20ms"]);
    let mut stdin = child.stdin.take().unwrap();
    let (verdicts, reader) = verdict_stream(&mut child);
    // Generous: the window is 20 ms; only a batch waiting to fill would miss it.
    let within = std::time::Duration::from_secs(10);
    let inputs = [
        envelope("w1"),
        "garbage".into(),
        envelope("w1"),
        envelope("w2"),
    ];
    let expected = ["run", "reject", "skip", "run"];
    for (n, (input, want)) in inputs.iter().zip(expected).enumerate() {
        writeln!(stdin, "{input}").unwrap();
        stdin.flush().unwrap();
        let got = verdicts
            .recv_timeout(within)
            .unwrap_or_else(|e| panic!("no verdict for line {} while stdin is open: {e}", n + 1));
        assert_eq!(got["line"], n as u64 + 1, "{got}");
        assert_eq!(got["decision"], want, "{got}");
    }
    drop(stdin);
    let status = child.wait().unwrap();
    reader.join().unwrap();
    assert_eq!(status.code(), Some(4), "a poison line, nothing to retry");
    // A burst is still batched: many lines, one verdict each, in order.
    let burst: Vec<String> = (0..1000)
        .map(|i| envelope(&format!("b{}", i % 700)))
        .collect();
    let out = bq(&["run", "--store", "memory"], &burst.join("\n"));
    let got = decisions(&out);
    assert_eq!(got.len(), 1000);
    for (i, d) in got.iter().enumerate() {
        assert_eq!(d["line"], i as u64 + 1);
        assert_eq!(d["id"], json!(format!("b{}", i % 700)));
        assert_eq!(d["decision"], if i < 700 { "run" } else { "skip" }, "{d}");
    }
}

/// The child's exit status, once it exits; killed and failed (with `what`) if it
/// is still running after `secs` seconds.
fn exit_within(child: &mut std::process::Child, secs: u64, what: &str) -> std::process::ExitStatus {
    let started = std::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if started.elapsed() > std::time::Duration::from_secs(secs) {
            let _ = child.kill();
            panic!("bq-dedupe run {what} ({secs} s)");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The reader of stdout goes away mid-run while lines keep coming
/// (`bq-dedupe run | head -1`): the run stops with an error (exit 2), no hang.
#[test]
fn run_stops_with_an_error_when_stdout_is_closed() {
    let mut child = common::spawn(&["run", "--store", "memory"]);
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    // Far more verdicts than a pipe buffer holds, so printing must fail.
    let feeder = std::thread::spawn(move || {
        for i in 0..200_000 {
            if writeln!(stdin, "{}", envelope(&format!("closed-{i}"))).is_err() {
                return;
            }
        }
    });
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    let first: Value = serde_json::from_str(&first).unwrap();
    assert_eq!(first["line"], 1, "{first}");
    drop(stdout);
    let status = exit_within(&mut child, 60, "still running after its stdout closed");
    feeder.join().unwrap();
    assert_eq!(status.code(), Some(2), "a run that cannot print fails");
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(stderr.contains("Broken pipe"), "says why: {stderr}");
}

/// The reader of stdout goes away and stdin then goes quiet without closing
/// (`tail -f ... | bq-dedupe run | head -1`): the first verdict that cannot be
/// printed ends the run (exit 2) at once, not when the next line comes.
#[test]
fn run_stops_when_stdout_closes_even_while_stdin_is_idle() {
    let mut child = common::spawn(&["run", "--store", "memory", "--window", "5ms"]);
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    writeln!(stdin, "{}", envelope("idle-1")).unwrap();
    stdin.flush().unwrap();
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    assert!(first.contains("idle-1"), "{first}");
    drop(stdout);
    // Its verdict cannot be printed; after it, stdin stays open and silent.
    writeln!(stdin, "{}", envelope("idle-2")).unwrap();
    stdin.flush().unwrap();
    let status = exit_within(
        &mut child,
        20,
        "still waiting for input after its stdout closed",
    );
    drop(stdin);
    assert_eq!(status.code(), Some(2));
}

/// `--exec` gets each envelope exactly as it was delivered: escapes, non-ASCII
/// text and spacing untouched, byte for byte.
#[test]
fn exec_handler_gets_each_envelope_byte_for_byte() {
    let dir = scratch("exec-bytes");
    let got = dir.join("got");
    let _ = std::fs::remove_file(&got);
    // Each envelope as given (a line: it ends in a newline) appended to `got`.
    let cmd = format!("cat >> {}", got.display());
    let lines = [
        r#"{"job":"urn:babel:orders:created","trace_id":"t","data":{"note":"caf\u00e9 \"quoted\" \/ tab\t","emoji":"😀 größe"},"meta":{"id":"bytes-1","schema_version":1}}"#,
        r#"  {"job" : "urn:babel:x", "trace_id":"t","data":{"n":[1, 2.50, -0e3]},"meta":{"id":"bytes-\u0032","schema_version":1}}  "#,
    ];
    let out = bq(
        &["run", "--store", "memory", "--exec", &cmd],
        &lines.join("\n"),
    );
    let verdicts = decisions(&out);
    assert_eq!(verdicts.len(), 2, "{out:?}");
    assert!(
        verdicts.iter().all(|v| v["decision"] == "run"),
        "{verdicts:?}"
    );
    assert_eq!(verdicts[1]["id"], "bytes-2", "the escaped id, decoded");
    let written = std::fs::read_to_string(&got).unwrap();
    assert_eq!(written, format!("{}\n{}\n", lines[0], lines[1]));
}

/// A handler that reads its input as a line (`read`, a line-by-line loop) gets
/// the envelope: it is written as one line, ending in a newline. Written
/// without one, `while read -r e` never ran its body and exited 0: each
/// delivery was `run-ok` and its id recorded, its effect never made (a review).
#[test]
fn exec_handler_that_reads_lines_gets_each_envelope() {
    let dir = scratch("exec-lines");
    let got = dir.join("got");
    let _ = std::fs::remove_file(&got);
    let cmd = format!(
        r#"while IFS= read -r e; do printf '%s\n' "$e" >> {}; done"#,
        got.display()
    );
    let lines = [envelope("lines-1"), envelope("lines-2")];
    let out = bq(
        &["run", "--store", "memory", "--exec", &cmd],
        &lines.join("\n"),
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let written = std::fs::read_to_string(&got).unwrap_or_default();
    assert_eq!(written, format!("{}\n{}\n", lines[0], lines[1]));
}

/// `run --fingerprint` end to end on a persistent store: a redelivery (even
/// re-encoded) is a skip, an id reused with other `data` is poison
/// (`payload-mismatch`, exit 4) in the same run and in a later one; without the
/// flag the reused id is only a skip; `forget --fingerprint` lets it run again.
#[test]
fn run_with_fingerprints_rejects_an_id_reused_with_other_data() {
    let spec = format!(
        "sqlite:{}",
        scratch("fingerprint").join("seen.db").display()
    );
    let with = |id: &str, data: Value| {
        json!({
            "job": "urn:babel:orders:created", "trace_id": "t-1", "data": data,
            "meta": {"id": id, "schema_version": 1}
        })
        .to_string()
    };
    let summary = |out: &std::process::Output| -> Vec<(String, String)> {
        decisions(out)
            .iter()
            .map(|d| {
                let s = |k: &str| d[k].as_str().unwrap().to_owned();
                (s("decision"), s("outcome"))
            })
            .collect()
    };
    let pair = |d: &str, o: &str| (d.to_owned(), o.to_owned());
    let first = bq(
        &["run", "--fingerprint", "--store", &spec],
        &[
            with("p1", json!({"order_id": 1, "sku": "a"})),
            // The same payload, keys in another order: a redelivery.
            with("p1", json!({"sku": "a", "order_id": 1})),
            with("p2", json!({"order_id": 2})),
        ]
        .join("\n"),
    );
    assert_eq!(
        summary(&first),
        [
            pair("run", "run-ok"),
            pair("skip", "skip"),
            pair("run", "run-ok")
        ],
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    assert_eq!(first.status.code(), Some(0));

    // Twice in one batch, each is the mismatch it is alone (the copy came back
    // `park`, exit 3: a review).
    let reused = bq(
        &["run", "--fingerprint", "--store", &spec],
        &[
            with("p1", json!({"order_id": 1, "sku": "b"})),
            with("p2", json!({"order_id": 2})),
            with("p1", json!({"order_id": 1, "sku": "b"})),
        ]
        .join("\n"),
    );
    let verdicts = decisions(&reused);
    assert_eq!(
        summary(&reused),
        [
            pair("reject", "payload-mismatch"),
            pair("skip", "skip"),
            pair("reject", "payload-mismatch")
        ]
    );
    assert_eq!(verdicts[0]["id"], "p1");
    assert_eq!(reused.status.code(), Some(4), "poison, nothing to retry");

    // Without fingerprints the same line is taken for a redelivery.
    let plain = bq(
        &["run", "--store", &spec],
        &with("p1", json!({"order_id": 1, "sku": "b"})),
    );
    assert_eq!(summary(&plain), [pair("skip", "skip")]);

    let forgot = bq(&["forget", "--fingerprint", "--store", &spec, "p1"], "");
    assert!(forgot.status.success());
    let again = bq(
        &["run", "--fingerprint", "--store", &spec],
        &[
            with("p1", json!({"order_id": 1, "sku": "b"})),
            with("p1", json!({"order_id": 1, "sku": "c"})),
        ]
        .join("\n"),
    );
    assert_eq!(
        summary(&again),
        [pair("run", "run-ok"), pair("reject", "payload-mismatch")],
        "after forget the id runs once more; one id, two payloads in one batch"
    );

    // Another payload behind a first delivery that failed in the same batch:
    // decided again after it, as one at a time, and it runs.
    let after_failure = bq(
        &[
            "run",
            "--fingerprint",
            "--store",
            &spec,
            "--batch",
            "2",
            "--exec",
            r#"! grep -q '"sku":"fails"'"#,
        ],
        &[
            with("p3", json!({"sku": "fails"})),
            with("p3", json!({"sku": "runs"})),
        ]
        .join("\n"),
    );
    assert_eq!(
        summary(&after_failure),
        [pair("failed", "run-failed"), pair("run", "run-ok")]
    );
}

/// A store that keeps another SDK's records (the PHP dialect of Redis) cannot
/// hold fingerprint records: `run --fingerprint` refuses it before reading a
/// line (exit 2), and without the flag the same store runs.
#[test]
fn run_with_fingerprints_refuses_a_store_of_another_sdks_format() {
    let url = redis_url().unwrap();
    let spec = format!("{}&dialect=php", redis_spec(&url, "fingerprint-php"));
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let line = envelope(&format!("fp-php-{}-{nanos}", std::process::id()));
    let refused = bq(&["run", "--fingerprint", "--store", &spec], &line);
    assert_eq!(refused.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("--fingerprint needs our own record format"),
        "{stderr}"
    );
    assert!(decisions(&refused).is_empty(), "nothing was decided");
    let plain = bq(&["run", "--store", &spec], &line);
    assert_eq!(
        plain.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&plain.stderr)
    );
    assert_eq!(decisions(&plain)[0]["decision"], "run");
}

/// An ordered stream gets the verdicts of one-at-a-time processing whatever
/// its batching (issue #29: in a batch, the redeliveries of an id that failed
/// came back `park`, "another consumer holds the claim", where one at a time
/// they ran again). The sample stream with the demo's handler (the third order
/// fails once), batch 1 against the default batch, seen-set and claiming.
#[test]
fn verdicts_do_not_depend_on_batching() {
    let sample =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/sample-stream.jsonl");
    let input = std::fs::read_to_string(&sample).unwrap();
    for mode in [&[][..], &["--claim"][..]] {
        let mut runs = Vec::new();
        for batch in ["1", "100"] {
            let dir = scratch("batching");
            let spec = format!("sqlite:{}", dir.join("seen.db").display());
            let marker = dir.join("failed-once");
            let cmd = format!(
                "e=$(cat); case \"$e\" in *00000003-*) [ -e {0} ] || {{ touch {0}; echo gateway timeout >&2; exit 1; }};; esac",
                marker.display()
            );
            let mut args = vec!["run", "--store", &spec, "--exec", &cmd, "--batch", batch];
            args.extend_from_slice(mode);
            let out = bq(&args, &input);
            let verdicts: Vec<(Value, Value)> = decisions(&out)
                .iter()
                .map(|d| (d["decision"].clone(), d["reason"].clone()))
                .collect();
            runs.push(verdicts);
        }
        assert_eq!(runs[0], runs[1], "{mode:?}: batch 1 vs batch 100");
        let decided: Vec<&Value> = runs[1].iter().map(|(d, _)| d).collect();
        assert_eq!(
            decided[3..6],
            [&json!("failed"), &json!("run"), &json!("skip")],
            "{mode:?}"
        );
    }
}

/// `conformance` without `--store` runs on memory: it used to default to the
/// user's own store and leave its records there for good.
#[test]
fn conformance_defaults_to_memory_and_leaves_no_store_behind() {
    let dir = scratch("conformance-default");
    let out = common::command()
        .arg("conformance")
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("0 failed"));
    assert!(
        !dir.join(".bq-dedupe").exists(),
        "no default store was created"
    );
}

/// An empty `--exec` (`--exec "$UNSET"`) ran `sh -c ""`, which succeeds: every
/// id was recorded as done and nothing ran (a trial's finding). Refused.
#[test]
fn an_empty_exec_is_refused_and_records_nothing() {
    let dir = scratch("empty-exec");
    let db = dir.join("seen.db");
    let spec = format!("sqlite:{}", db.display());
    for empty in ["", "  "] {
        let out = bq(&["run", "--store", &spec, "--exec", empty], &envelope("e1"));
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(
            said.contains("an empty command would run nothing"),
            "{said}"
        );
    }
    assert!(!db.exists(), "nothing was recorded");
}

/// `--lease` without `--claim` was accepted and ignored: a user who meant
/// claiming ran in the seen-set mode, with no word (a trial's finding).
#[test]
fn a_lease_without_claim_is_refused_and_records_nothing() {
    let dir = scratch("lease-without-claim");
    let db = dir.join("seen.db");
    let spec = format!("sqlite:{}", db.display());
    let out = bq(
        &["run", "--store", &spec, "--lease", "30s"],
        &envelope("l1"),
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("--claim"), "{said}");
    assert!(!db.exists(), "nothing was recorded");
}

/// `--claim --lease 30s --ttl 1s` was accepted without a word: an id's
/// record lapsed before a claim on it would, and its redelivery after the
/// TTL ran again, run-ok both times (an operator trial's finding). Said at
/// start; a TTL at least the lease is not.
#[test]
fn a_ttl_shorter_than_the_lease_is_said() {
    let dir = scratch("ttl-under-lease");
    let spec = format!("sqlite:{}", dir.join("seen.db").display());
    let said = |ttl: &str| {
        let args = [
            "run", "--store", &spec, "--claim", "--lease", "30s", "--ttl", ttl,
        ];
        let out = bq(&args, &envelope(&format!("t-{ttl}")));
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let short = said("1s");
    assert!(
        short.contains("--ttl 1s is shorter than --lease 30s"),
        "{short}"
    );
    assert!(!short.contains("  "), "one line, single spaces: {short}");
    let long = said("30s");
    assert!(!long.contains("shorter than --lease"), "{long}");
}

/// `run | head`: stdout closed while lines were being decided. The run said
/// only "Broken pipe", though lines whose verdicts nobody saw were recorded
/// (their rerun skips them: a trial's finding). It now says up to which line
/// verdicts were printed and up to which lines were decided and recorded.
#[cfg(unix)]
#[test]
fn a_closed_stdout_says_which_lines_were_decided_without_a_verdict() {
    use std::io::{BufRead, BufReader};
    let dir = scratch("closed-stdout");
    let spec = format!("sqlite:{}", dir.join("seen.db").display());
    let input = dir.join("in.jsonl");
    let lines: Vec<String> = (0..20_000).map(|i| envelope(&format!("c-{i}"))).collect();
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let mut child = common::spawn(&["run", "--store", &spec, input.to_str().unwrap()]);
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    drop(out); // as `head -1` does
    let finished = child.wait_with_output().unwrap();
    assert_eq!(finished.status.code(), Some(2), "{finished:?}");
    let said = String::from_utf8_lossy(&finished.stderr);
    // "... written to stdout up to line P; decided up to line D ...; feed them
    // again from line P+1" (not D+1: a failure among them is not recorded: a
    // review's finding).
    let number_after = |text: &str| -> u64 {
        let at = said
            .find(text)
            .unwrap_or_else(|| panic!("{text:?} in {said}"));
        said[at + text.len()..]
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .parse()
            .unwrap_or_else(|e| panic!("a line number after {text:?} in {said}: {e}"))
    };
    let printed = number_after("stdout up to line ");
    let decided = number_after("decided up to line ");
    assert_eq!(number_after("again from line "), printed + 1, "{said}");
    assert!(
        1 <= printed && printed <= decided && decided < 20_000,
        "{said}"
    );
    // The rerun skips exactly the lines said decided, and runs the rest.
    let rerun = bq(&["run", "--store", &spec, input.to_str().unwrap()], "");
    let verdicts = decisions(&rerun);
    assert_eq!(verdicts.len(), 20_000);
    for v in &verdicts {
        let line = v["line"].as_u64().unwrap();
        let expected = if line <= decided { "skip" } else { "run" };
        assert_eq!(v["decision"], expected, "line {line}; {said}");
    }
}

/// `forget` of an id nothing holds sends no delete: it checked first, then
/// deleted, so a claim a consumer took between the two (some 300 ms while the
/// component loads) was deleted, and a redelivery ran beside that consumer's
/// handler; `forget` said "nothing to forget" (a review's finding, on Redis
/// with a PHP-format peer). Watched with MONITOR: no DEL of the id's key.
#[test]
fn forget_of_an_id_nothing_holds_deletes_nothing() {
    use std::io::{BufRead, BufReader};
    let url = redis_url().unwrap();
    let spec = redis_spec(&url, "forget-free");
    let mut monitor = std::process::Command::new("redis-cli")
        .args(["-u", &url, "monitor"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("redis-cli runs");
    let mut seen = BufReader::new(monitor.stdout.take().unwrap()).lines();
    assert_eq!(seen.next().unwrap().unwrap(), "OK");
    let id = format!("free-{}", std::process::id());
    let out = bq(&["forget", "--store", &spec, &id], "");
    assert!(out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("nothing to forget"), "{said}");
    // A mark after forget's commands, to know MONITOR has shown them all.
    let mark = format!("forget-free-mark-{}", std::process::id());
    let mut redis = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let _: String = redis::cmd("ECHO").arg(&mark).query(&mut redis).unwrap();
    let mut about_id = Vec::new();
    for line in seen.by_ref() {
        let line = line.unwrap();
        if line.contains(&mark) {
            break;
        }
        if line.contains(&id) {
            about_id.push(line);
        }
    }
    let _ = monitor.kill();
    let _ = monitor.wait();
    assert!(!about_id.is_empty(), "forget read the id's key first");
    let deletes: Vec<_> = about_id
        .iter()
        .filter(|l| {
            let l = l.to_ascii_uppercase();
            l.contains("\"DEL\"") || l.contains("\"UNLINK\"")
        })
        .collect();
    assert!(deletes.is_empty(), "{deletes:#?}");
}

/// `--component` with the minimal world's component (no store imports beside
/// `seen-set`, which this host does not give): refused, the cause first. It
/// read "the component lacks an export", the import it lacks said last (a
/// review's finding).
#[test]
fn a_component_of_another_world_is_refused_saying_why() {
    let minimal = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/component/bq_dedupe_minimal.component.wasm");
    assert!(
        minimal.exists(),
        "{} is built by scripts/build-component.sh (make test does)",
        minimal.display()
    );
    let out = bq(
        &[
            "--component",
            minimal.to_str().unwrap(),
            "run",
            "--store",
            "memory",
        ],
        &envelope("m1"),
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("does not fit this bq-dedupe: component imports instance")
            && said.contains("seen-set")
            && said.contains("`dedupe-minimal`"),
        "{said}"
    );
    assert!(decisions(&out).is_empty());
}

/// `run` says when it makes a new SQLite store, so a mistyped path is seen
/// (every id of the input would run again: a trial's finding); not again once
/// the file exists.
#[test]
fn run_says_when_it_makes_a_new_store() {
    let dir = scratch("new-store");
    let spec = format!("sqlite:{}", dir.join("typo").join("seen.db").display());
    let said = |out: &std::process::Output| String::from_utf8_lossy(&out.stderr).into_owned();
    let first = bq(
        &["run", "--store", &spec, "--exec", "cat >/dev/null"],
        &envelope("n1"),
    );
    assert!(first.status.success(), "{first:?}");
    assert!(
        said(&first).contains("nor its folder: a new, empty one is made there"),
        "{}",
        said(&first)
    );
    let second = bq(
        &["run", "--store", &spec, "--exec", "cat >/dev/null"],
        &envelope("n1"),
    );
    assert!(
        !said(&second).contains("a new, empty one"),
        "{}",
        said(&second)
    );
}

/// A slow `--exec` stream read from a file prints each verdict once it is
/// recorded, not all of them at the end of the chunk read (a trial's finding:
/// a `kill -9` printed nothing though ids were recorded, and "feed again from
/// the first line it did not print" meant feeding everything again).
#[test]
fn a_slow_stream_from_a_file_prints_as_it_goes() {
    let dir = scratch("slow-print");
    let spec = format!("sqlite:{}", dir.join("seen.db").display());
    let input = dir.join("in.jsonl");
    let lines: Vec<String> = (0..8).map(|i| envelope(&format!("slow-{i}"))).collect();
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let mut child = Command::new(BIN)
        .args([
            "run",
            "--store",
            &spec,
            "--exec",
            "sleep 0.3; cat >/dev/null",
        ])
        .arg(&input)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let (line, lines_read) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for read in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            let _ = line.send(read);
        }
    });
    // Eight handlers of 0.3 s: killed once two verdicts are out (a fixed
    // 1.5 s could be before them on a loaded machine). Printed at the end of
    // the chunk read, all eight would be out by then.
    let mut printed = Vec::new();
    for _ in 0..2 {
        let limit = std::time::Duration::from_secs(60);
        printed.push(lines_read.recv_timeout(limit).expect("a verdict"));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    printed.extend(lines_read.iter());
    let printed: Vec<Value> = (printed.iter())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        printed.len() < 8,
        "every verdict was out by the second: {printed:?}"
    );
    // Each one printed was recorded: the rerun skips it.
    let again = bq(
        &["run", "--store", &spec, "--exec", "cat >/dev/null"],
        &(lines.join("\n") + "\n"),
    );
    let again = decisions(&again);
    assert_skipped_on_rerun(&printed, &again);
}

/// What a docs trial found in the messages: a directory given as the input is
/// named; an id's control characters reach no terminal raw; a run refused for
/// its options announces nothing before the refusal; a plain run on the PHP
/// SDK's format says it runs beside PHP's claims.
#[test]
fn messages_name_the_input_escape_ids_and_refuse_before_announcing() {
    let dir = scratch("messages");
    let spec = format!("sqlite:{}", dir.join("seen.db").display());

    let out = bq(&["check", dir.to_str().unwrap()], "");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains(dir.to_str().unwrap()) && said.contains("directory"),
        "names the directory: {said}"
    );

    let hostile = "\u{1b}]0;pwned\u{7}\u{1b}[31mRED\u{2028}\u{202e}";
    bq(&["run", "--store", &spec], &envelope(hostile));
    for args in [
        vec!["forget", "--store", &spec, hostile],
        vec!["forget", "--store", &spec, hostile],
    ] {
        let out = bq(&args, "");
        let all = [out.stdout, out.stderr].concat();
        assert!(
            !all.contains(&0x1b)
                && !all.contains(&0x07)
                && !String::from_utf8_lossy(&all).contains(['\u{2028}', '\u{202e}']),
            "the id's escapes are printed escaped: {:?}",
            String::from_utf8_lossy(&all)
        );
    }

    let url = redis_url().unwrap();
    let go = format!("{}&dialect=go", redis_spec(&url, "refused"));
    let out = bq(&["run", "--claim", "--store", &go], &envelope("r1"));
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("cannot claim"), "{said}");
    assert!(!said.contains("a mark run"), "no run announced: {said}");

    let php = format!("{}&dialect=php", redis_spec(&url, "php-plain"));
    let out = bq(&["run", "--store", &php], &envelope("p1"));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("--claim"),
        "a plain run on PHP's format says so: {said}"
    );
    let out = bq(&["run", "--claim", "--store", &php], &envelope("p2"));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!said.contains("without --claim"), "{said}");
}

/// A rejected line's verdict names its `meta.id` where it can be read, as
/// `check` does (`run` printed `"id":null`: a trial), so a supervisor can find
/// the poison message by its id.
#[test]
fn a_rejected_lines_verdict_names_its_id_as_check_does() {
    let line = r#"{"job":"urn:babel:orders:created","trace_id":"t","data":{},"meta":{"id":"poison-7","schema_version":2}}"#;
    let run = bq(&["run", "--store", "memory"], &format!("{line}\n"));
    let verdict = &decisions(&run)[0];
    assert_eq!(verdict["decision"], "reject", "{verdict}");
    assert_eq!(verdict["id"], "poison-7", "{verdict}");
    let dir = scratch("rejected-id");
    let input = dir.join("in.jsonl");
    std::fs::write(&input, format!("{line}\n")).unwrap();
    let check = bq(&["check", input.to_str().unwrap()], "");
    let record: Value =
        serde_json::from_slice(check.stdout.split(|&b| b == b'\n').next().unwrap()).unwrap();
    assert_eq!(record["id"], verdict["id"], "{record}");
}

/// A directory given as the SQLite store is a spec to fix: exit 2, said so
/// (it was exit 6, "the store cannot be reached: run it again later", with
/// SQLite's "unable to open database file": a trial).
#[test]
fn a_directory_given_as_the_sqlite_store_exits_2() {
    let dir = scratch("sqlite-dir");
    let out = bq(
        &["run", "--store", &format!("sqlite:{}", dir.display())],
        "",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("is a directory"), "{stderr}");
}

/// A store that answers reads but refuses writes (a full disk; here a trigger)
/// stops the run at the first success it does not record: every later new id
/// ran unrecorded, 3,000 of 3,000 (a trial). The lines after it are not
/// decided (no verdict: fed again later), and the run exits 3.
#[test]
fn a_store_that_refuses_writes_stops_the_run_at_the_first_unrecorded_success() {
    let dir = scratch("refuses-writes");
    let db = dir.join("seen.db");
    let spec = format!("sqlite:{}", db.display());
    assert!(
        bq(&["run", "--store", &spec], "").status.success(),
        "the store is made"
    );
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute_batch(
        "CREATE TRIGGER full BEFORE INSERT ON bq_dedupe BEGIN SELECT RAISE(ABORT, 'disk full'); END;
         CREATE TRIGGER full_too BEFORE UPDATE ON bq_dedupe BEGIN SELECT RAISE(ABORT, 'disk full'); END;",
    )
    .unwrap();
    drop(conn);
    let runs = dir.join("runs");
    let handler = format!("cat >> {}; echo >> {}", runs.display(), runs.display());
    let input: Vec<String> = (0..5).map(|i| envelope(&format!("full-{i}"))).collect();
    let out = bq(
        &["run", "--store", &spec, "--batch", "1", "--exec", &handler],
        &input.join("\n"),
    );
    let d = decisions(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(d.len(), 1, "one verdict, then stopped: {d:?} {stderr}");
    assert_eq!(d[0]["outcome"], "run-ok-unrecorded", "{}", d[0]);
    let ran = std::fs::read_to_string(&runs).unwrap_or_default();
    assert_eq!(ran.lines().filter(|l| !l.is_empty()).count(), 1, "{ran}");
    assert!(stderr.contains("did not record a success"), "{stderr}");
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    // Unrecorded in the stream's last call, with no line after it: every
    // delivery is decided, so the run ends as a whole one, exit 5 (every
    // delivery done, some may run again). It exited 3 ("retry") and said
    // lines after it were left undecided, where there were none (a trial).
    for (input, batch) in [(&input[..1], "1"), (&input[..3], "10")] {
        let out = bq(
            &[
                "run", "--store", &spec, "--batch", batch, "--exec", &handler,
            ],
            &input.join("\n"),
        );
        let d = decisions(&out);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(d.len(), input.len(), "{d:?} {stderr}");
        assert!(
            d.iter().all(|d| d["outcome"] == "run-ok-unrecorded"),
            "{d:?}"
        );
        assert!(!stderr.contains("were not decided"), "{stderr}");
        assert!(stderr.contains("summary:"), "{stderr}");
        assert_eq!(out.status.code(), Some(5), "{stderr}");
    }
}
