//! `bq-dedupe run --exec`: the handler's process, as issue #29 found it. Its
//! input is fed from a thread while its stderr is drained into a bounded tail,
//! it is done when it exits (whatever it left running), and it is killed with
//! its process group at `--handler-timeout`. Wall-clock bounds here are
//! deadlines a hang would miss by far, not timings.

mod common;

use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

fn envelope(id: &str, pad: usize) -> String {
    serde_json::json!({
        "job": "urn:babel:orders:created",
        "trace_id": "7b3f9c2a-e41d-4f88-9b2a-1c0d5e6f7a8b",
        "data": {"pad": "x".repeat(pad)},
        "meta": {"id": id, "queue": "orders", "schema_version": 1},
    })
    .to_string()
}

/// Runs `bq-dedupe ARGS` on `input`, killed and failed if it has not exited
/// after `secs`; its verdicts and how long it took.
fn run_within(args: &[&str], input: &str, secs: u64) -> (Vec<Value>, Duration, String) {
    let started = Instant::now();
    let mut child = spawn(args);
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_owned();
    std::thread::spawn(move || {
        let _ = stdin.write_all(input.as_bytes());
    });
    let out = wait_within(child, secs);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (decisions(&out), started.elapsed(), stderr)
}

fn wait_within(child: Child, secs: u64) -> std::process::Output {
    let pid = child.id();
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || done.send(child.wait_with_output()));
    match finished.recv_timeout(Duration::from_secs(secs)) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let _ = std::process::Command::new("kill")
                .arg("-9")
                .arg(pid.to_string())
                .status();
            panic!("bq-dedupe run still running after {secs} s: a hang");
        }
    }
}

/// Measured on today's main: a 200 KB envelope whose handler writes 100 KB to
/// stderr before reading its input had no verdict after 20 s (the host wrote
/// stdin whole before reading stderr; each side waited on a full pipe).
#[test]
fn a_handler_that_writes_stderr_before_reading_its_input_does_not_deadlock() {
    let cmd = "head -c 100000 /dev/zero | tr '\\0' e >&2; cat > /dev/null";
    let (verdicts, _, stderr) = run_within(
        &["run", "--store", "memory", "--exec", cmd],
        &envelope("pipes-1", 200_000),
        30,
    );
    assert_eq!(verdicts.len(), 1, "{stderr}");
    assert_eq!(verdicts[0]["decision"], "run", "{verdicts:?}");
}

/// A handler that exits 0 leaving a background child (which keeps its stderr
/// open) is done when it exits: before, the run waited the child's whole life.
#[test]
fn a_handler_is_done_when_it_exits_whatever_it_left_running() {
    let cmd = "cat > /dev/null; sleep 30 & exit 0";
    let (verdicts, took, stderr) = run_within(
        &["run", "--store", "memory", "--exec", cmd],
        &envelope("background-1", 10),
        25,
    );
    assert_eq!(verdicts.len(), 1, "{stderr}");
    assert_eq!(verdicts[0]["decision"], "run", "{verdicts:?}");
    assert!(
        took < Duration::from_secs(20),
        "waited {took:?} for the background child"
    );
}

/// Started with SIGCHLD ignored (as some supervisors leave it, kept across
/// exec), a handler's exit status is still read: every success was reported
/// `failed` (the kernel had reaped it) and ran again on each redelivery (a trial).
#[test]
fn a_run_started_with_sigchld_ignored_still_reads_its_handlers_status() {
    let dir = scratch("sigchld");
    let spec = format!("sqlite:{}", dir.join("seen.db").display());
    let log = dir.join("runs");
    let ok = format!("cat >> {}", log.display());
    let ignored = |handler: &str, ids: &[&str]| {
        let script = "import os, signal, sys; signal.signal(signal.SIGCHLD, signal.SIG_IGN); \
                      os.execv(sys.argv[1], sys.argv[1:])";
        let mut child = Command::new("python3")
            .args([
                "-c", script, BIN, "run", "--store", &spec, "--exec", handler,
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let input: Vec<String> = ids.iter().map(|id| envelope(id, 10)).collect();
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(input.join("\n").as_bytes()).unwrap();
        drop(stdin);
        let out = wait_within(child, 30);
        let verdicts: Vec<Value> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        (verdicts, out.status.code(), stderr)
    };
    let decisions = |verdicts: &[Value]| -> Vec<String> {
        verdicts
            .iter()
            .map(|v| v["decision"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    let (first, code, stderr) = ignored(&ok, &["sigchld-1", "sigchld-2"]);
    assert_eq!(decisions(&first), ["run", "run"], "{first:?} {stderr}");
    assert_eq!(code, Some(0), "{stderr}");
    let (again, _, stderr) = ignored(&ok, &["sigchld-1", "sigchld-2"]);
    assert_eq!(decisions(&again), ["skip", "skip"], "{again:?} {stderr}");
    let runs = std::fs::read_to_string(&log).unwrap();
    assert_eq!(runs.lines().count(), 2, "each handler ran once: {runs}");
    // A failure is still a failure, with its status.
    let (failed, code, stderr) = ignored("cat > /dev/null; exit 7", &["sigchld-3"]);
    assert_eq!(decisions(&failed), ["failed"], "{stderr}");
    let reason = failed[0]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("status 7"), "{reason}");
    assert_eq!(code, Some(3));
}

fn alive(pid: &str) -> bool {
    // A zombie has exited: only a live process has a state other than Z.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit(')')
            .next()
            .is_some_and(|s| !s.trim_start().starts_with('Z'))
    })
}

/// A hung handler is killed at `--handler-timeout` with everything it started
/// (its process group), the delivery fails with a reason that says so, and in
/// claiming mode its claim is released: the redelivery runs at once.
#[test]
fn a_hung_handler_is_killed_with_its_process_group_at_the_timeout() {
    let dir = scratch("hung");
    let spec = format!("sqlite:{}", dir.join("seen.db").display());
    let pids = dir.join("pids");
    // The first attempt hangs (a background child and a foreground sleep); the
    // second succeeds.
    let cmd = format!(
        "cat > /dev/null; if [ ! -e {0} ]; then sleep 60 & echo $! > {0}; echo $$ >> {0}; sleep 60; fi",
        pids.display()
    );
    let args = [
        "run",
        "--store",
        &spec,
        "--claim",
        "--lease",
        "30s",
        "--exec",
        &cmd,
        "--handler-timeout",
        "1s",
        "--batch",
        "1",
    ];
    let (verdicts, took, stderr) = run_within(&args, &envelope("hung-1", 10), 30);
    assert_eq!(verdicts.len(), 1, "{stderr}");
    assert_eq!(verdicts[0]["decision"], "failed", "{verdicts:?}");
    let reason = verdicts[0]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("timed out after 1s"), "{reason}");
    assert!(took < Duration::from_secs(20), "took {took:?}");
    // Everything the handler started is gone.
    let started = std::fs::read_to_string(&pids).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    for pid in started.split_whitespace() {
        assert!(
            !alive(pid),
            "process {pid} of the killed handler still runs"
        );
    }
    // The claim was released, not left to its 30 s lease: the redelivery runs.
    let (verdicts, _, stderr) = run_within(&args, &envelope("hung-1", 10), 30);
    assert_eq!(verdicts[0]["decision"], "run", "{verdicts:?} {stderr}");
}

/// A handler that fails (exits non-zero, or its shell is killed) has what it
/// started killed with it: the delivery is retried, and a child of the failed
/// run went on beside the retry, its effect perhaps made after the retry's (a
/// trial's finding: the timeout killed the group, a failure did not).
#[test]
fn a_failed_handler_takes_what_it_started_with_it() {
    let dir = scratch("failed-group");
    for (name, end) in [("exit", "exit 3"), ("killed", "kill -9 $$")] {
        let pids = dir.join(format!("pids-{name}"));
        let _ = std::fs::remove_file(&pids);
        let cmd = format!(
            "cat > /dev/null; sleep 30 & echo $! > {}; {end}",
            pids.display()
        );
        let (verdicts, _, stderr) = run_within(
            &["run", "--store", "memory", "--exec", &cmd],
            &envelope(&format!("failed-group-{name}"), 10),
            25,
        );
        assert_eq!(verdicts[0]["decision"], "failed", "{verdicts:?} {stderr}");
        let child = std::fs::read_to_string(&pids).unwrap();
        let gone = (0..50).any(|_| {
            std::thread::sleep(Duration::from_millis(20));
            !alive(child.trim())
        });
        assert!(
            gone,
            "{name}: the failed handler's child {child} still runs"
        );
    }
}

/// A handler writing 300 MB to stderr grew the host to 306 MB: only a bounded
/// tail of it is kept (for the reason).
#[test]
fn a_handler_flooding_stderr_keeps_the_host_small() {
    let cmd =
        "cat > /dev/null; head -c 300000000 /dev/zero | tr '\\0' e >&2; echo the-end >&2; exit 1";
    let mut child = spawn(&["run", "--store", "memory", "--exec", cmd]);
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{}", envelope("flood-1", 10)).unwrap();
    drop(stdin);
    let (out, peak_kb) = wait_with_peak_kb(child);
    let verdicts = decisions(&out);
    assert_eq!(verdicts[0]["decision"], "failed", "{verdicts:?}");
    let reason = verdicts[0]["reason"].as_str().unwrap_or_default();
    assert!(reason.ends_with("the-end"), "the tail of stderr: {reason}");
    assert!(peak_kb > 0, "the host's peak size was read");
    assert!(
        peak_kb < 150_000,
        "the host grew to {peak_kb} kB on a handler's stderr"
    );
}

/// `--show-handler-output`: a developer sees what the handler printed, on
/// this command's stderr (its stdout stays the verdicts, one JSON per line);
/// by default neither stream is shown, and a failure's reason still carries
/// the end of stderr.
#[test]
fn show_handler_output_passes_both_streams_to_stderr() {
    let handler = "echo out-of-handler; echo err-of-handler >&2; exit 0";
    let input = format!("{}\n", envelope("shown-1", 0));
    let (verdicts, _, stderr) = run_within(
        &[
            "run",
            "--store",
            "memory",
            "--exec",
            handler,
            "--show-handler-output",
        ],
        &input,
        60,
    );
    assert_eq!(verdicts.len(), 1, "{verdicts:?}");
    assert_eq!(verdicts[0]["outcome"], "run-ok", "{verdicts:?}");
    assert!(stderr.contains("out-of-handler"), "{stderr}");
    assert!(stderr.contains("err-of-handler"), "{stderr}");
    let (_, _, quiet) = run_within(&["run", "--store", "memory", "--exec", handler], &input, 60);
    assert!(!quiet.contains("of-handler"), "{quiet}");
}

/// A handler that logs `start`, sleeps, then logs `effect`, in claiming mode
/// on a SQLite file with `flags`; `bq-dedupe run` started on a line per id
/// with stdin left open (a stream), returned once the first handler started:
/// its child, the log and its stdin.
fn slow_run(
    name: &str,
    flags: &[&str],
    ids: &[&str],
) -> (Child, std::path::PathBuf, std::process::ChildStdin) {
    slow_run_as(name, flags, ids, Form::Inline)
}

/// [`slow_run`], the handler given to `--exec` in the [`Form`] named.
/// How `--exec` names the slow handler.
#[derive(Debug, Clone, Copy)]
enum Form {
    /// The commands themselves, for `sh -c`.
    Inline,
    /// A script by its path alone (the README's form).
    Script,
    /// The same script given to a program as its argument (`sh PATH`), which
    /// the shell forks and waits for.
    ScriptWithArgs,
}

fn slow_run_as(
    name: &str,
    flags: &[&str],
    ids: &[&str],
    form: Form,
) -> (Child, std::path::PathBuf, std::process::ChildStdin) {
    let dir = scratch(name);
    let log = dir.join("log");
    let mut cmd = slow_handler(&log);
    if let Form::Script | Form::ScriptWithArgs = form {
        let path = dir.join("handler.sh");
        std::fs::write(&path, format!("#!/bin/sh\n{}\n", cmd.replace("; ", "\n"))).unwrap();
        let mode = std::os::unix::fs::PermissionsExt::from_mode(0o755);
        std::fs::set_permissions(&path, mode).unwrap();
        cmd = match form {
            Form::ScriptWithArgs => format!("sh {}", path.display()),
            _ => path.display().to_string(),
        };
    }
    let store = format!("sqlite:{}", dir.join("db").display());
    let mut args = vec!["run", "--store", &store, "--claim", "--exec", &cmd];
    args.extend_from_slice(flags);
    let mut child = spawn(&args);
    let mut stdin = child.stdin.take().unwrap();
    for id in ids {
        writeln!(stdin, "{}", envelope(id, 10)).unwrap();
    }
    wait_for_start(&log);
    (child, log, stdin)
}

/// A handler that logs `start`, takes 1.5 s, then logs `effect`.
fn slow_handler(log: &std::path::Path) -> String {
    format!(
        "cat >/dev/null; echo start >> {log}; sleep 1.5; echo effect >> {log}",
        log = log.display()
    )
}

/// Waits (up to 20 s) until a [`slow_handler`] has logged its start.
fn wait_for_start(log: &std::path::Path) {
    let started = Instant::now();
    while std::fs::read_to_string(log).unwrap_or_default().is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the handler never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One delivery, its claim's lease short (300 ms: renewed while it runs).
fn slow_claiming_run(name: &str) -> (Child, std::path::PathBuf, std::process::ChildStdin) {
    slow_run(name, &["--lease", "300ms"], &["signal-1"])
}

fn signal(child: &Child, sig: &str) {
    let status = std::process::Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// SIGTERM (or a Ctrl-C's SIGINT) while a handler runs: the handler, in its own
/// process group, used to go on after `run` died, its claim no longer renewed,
/// and the redelivery ran beside it (an adversarial review's finding: two
/// effects, one verdict). Now `run` stops taking lines, lets the running
/// handler finish, prints and records its verdict, and exits 128 + the signal.
#[test]
fn sigterm_lets_the_running_handler_finish_and_records_it() {
    for (sig, code) in [("-TERM", 143), ("-INT", 130)] {
        let (child, log, stdin) = slow_claiming_run("sigterm");
        signal(&child, sig);
        let out = wait_within(child, 30);
        drop(stdin);
        let verdicts = decisions(&out);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{sig}: {stderr}");
        assert_eq!(verdicts.len(), 1, "{sig}: {stderr}");
        assert_eq!(verdicts[0]["outcome"], "run-ok", "{verdicts:?}");
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "start\neffect\n");
        assert!(stderr.contains("stopping"), "{stderr}");
    }
}

/// SIGTERM during the last call of a stream that has ended, whose success
/// the store does not record (a trigger refuses writes): every line was
/// decided, so the run ends as a whole one (exit 5, its summary). It said
/// "every line printed was decided and recorded" and exited 143, the
/// unrecorded success unsaid but in its counts (a review).
#[test]
fn a_signal_during_the_last_unrecorded_call_ends_a_whole_run() {
    let dir = scratch("sigterm-unrecorded");
    let db = dir.join("db");
    let store = format!("sqlite:{}", db.display());
    let made = spawn(&["run", "--store", &store]);
    assert!(wait_within(made, 30).status.success(), "the store is made");
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute_batch(
            "CREATE TRIGGER full BEFORE INSERT ON bq_dedupe BEGIN SELECT RAISE(ABORT, 'disk full'); END;",
        )
        .unwrap();
    let log = dir.join("log");
    let cmd = slow_handler(&log);
    // A batch the stream's end cuts (not its size, nor its window).
    let flags = ["--batch", "10", "--window", "60s"];
    let mut child = spawn(&[&["run", "--store", &store, "--exec", &cmd][..], &flags].concat());
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{}", envelope("last-unrecorded", 10)).unwrap();
    drop(stdin);
    wait_for_start(&log);
    signal(&child, "-TERM");
    let out = wait_within(child, 30);
    let verdicts = decisions(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(verdicts.len(), 1, "{stderr}");
    assert_eq!(verdicts[0]["outcome"], "run-ok-unrecorded", "{verdicts:?}");
    assert!(!stderr.contains("decided and recorded"), "{stderr}");
    assert!(stderr.contains("summary:"), "{stderr}");
    assert_eq!(out.status.code(), Some(5), "{stderr}");
}

/// A second signal does not wait: the handler's process group is killed
/// before `run` exits, so nothing of it goes on beside a redelivery.
#[test]
fn a_second_signal_kills_the_running_handler() {
    let (child, log, stdin) = slow_claiming_run("sigint-twice");
    signal(&child, "-INT");
    // Again, a few times: two signals the run had not read yet are one (a
    // loaded machine could leave it that long), and the handler finished.
    for _ in 0..6 {
        std::thread::sleep(Duration::from_millis(150));
        let _ = std::process::Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status();
    }
    let out = wait_within(child, 30);
    drop(stdin);
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{said}");
    // It says the batch's earlier successes are not recorded either (it named
    // only the delivery in progress: a review's finding).
    assert!(
        said.contains("the successes of its batch before it may not have been"),
        "{said}"
    );
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "start\n",
        "killed before its effect"
    );
}

/// `kill -9` of `run` while a handler runs: the handler dies with it (Linux:
/// the parent-death signal), so its effect never lands beside the
/// redelivery's. Also a script named by its path, the README's own form: a
/// shell that forks it and waits (dash, Debian's `sh`) died alone, and the
/// script went on beside the redelivery (a first user's trial), until `run`
/// had the shell exec a simple command. And a handler given with arguments
/// (`sh handler.sh`, `python3 h.py`), which no `exec` can cover: the shell
/// died alone and the program went on, until a guard process that outlives
/// `run` killed the running handler's process group.
#[cfg(unix)]
#[test]
fn kill_9_of_the_run_takes_its_handler_with_it() {
    for form in [Form::Inline, Form::Script, Form::ScriptWithArgs] {
        let flags = ["--lease", "300ms"];
        let (child, log, stdin) = slow_run_as("kill-9", &flags, &["signal-1"], form);
        assert_eq!(
            kill_9(child, stdin, &log),
            "start\n",
            "the handler died with it ({form:?})"
        );
    }
}

/// `kill -9` of `run` during a slow handler, after a fast one succeeded: with
/// `--exec` and no `--batch`, both were in one batch of 100, whose successes
/// were recorded at its end (or a second after, at the next handler's start),
/// so the rerun ran the fast one again (a first user's trial). An `--exec`
/// run's batch is 1 by default: each success is recorded before the next
/// handler starts.
#[cfg(unix)]
#[test]
fn a_success_before_a_slow_handler_survives_a_kill_9() {
    let dir = scratch("kill-9-after-success");
    let log = dir.join("log");
    let cmd = format!(
        "e=$(cat); case \"$e\" in *slow*) echo slow >> {log}; sleep 10;; *) echo fast >> {log};; esac",
        log = log.display()
    );
    let store = format!("sqlite:{}", dir.join("db").display());
    let mut run = spawn(&["run", "--store", &store, "--claim", "--exec", &cmd]);
    let mut stdin = run.stdin.take().unwrap();
    for id in ["fast-1", "slow-2", "later-3"] {
        writeln!(stdin, "{}", envelope(id, 10)).unwrap();
    }
    wait_for_log(&log, "fast\nslow\n");
    assert_eq!(kill_9(run, stdin, &log), "fast\nslow\n");
    let shown = bq(
        &["show", "--store", &store, "fast-1", "slow-2", "later-3"],
        "",
    );
    let states: Vec<String> = decisions(&shown)
        .iter()
        .map(|v| v["state"].as_str().unwrap().to_owned())
        .collect();
    // The slow one's claim stands until its lease ends; the third was never claimed.
    assert_eq!(states, ["done", "claimed", "free"], "{shown:?}");
}

/// The dead man's switch killed by hand between two handlers (only SIGKILL
/// stops it): the next handler's line went nowhere and no switch watched it,
/// so a `kill -9` of `run` left that handler running beside the redelivery
/// (a review's finding). A dead switch is reaped and started again, and the
/// line sent to the new one.
#[cfg(target_os = "linux")]
#[test]
fn a_switch_killed_between_handlers_is_started_again() {
    let flags = ["--lease", "300ms"];
    let (child, log, mut stdin) =
        slow_run_as("switch-killed", &flags, &["switch-1"], Form::ScriptWithArgs);
    wait_for_log(&log, "start\neffect\n");
    let switch = switch_of(child.id()).expect("a switch beside the handler");
    let status = std::process::Command::new("kill")
        .args(["-KILL", &switch.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    // Gone (a fixed 200 ms could be before it was, on a loaded machine).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while alive(&switch.to_string()) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    writeln!(stdin, "{}", envelope("switch-2", 10)).unwrap();
    wait_for_log(&log, "start\neffect\nstart\n");
    assert_eq!(
        kill_9(child, stdin, &log),
        "start\neffect\nstart\n",
        "the second handler died with the run"
    );
}

/// `kill -9` of the run, then its handler's log once a handler left running
/// would have written its effect.
fn kill_9(mut run: Child, stdin: std::process::ChildStdin, log: &std::path::Path) -> String {
    signal(&run, "-KILL");
    let _ = run.wait();
    drop(stdin);
    std::thread::sleep(Duration::from_secs(2));
    std::fs::read_to_string(log).unwrap()
}

fn wait_for_log(log: &std::path::Path, text: &str) {
    let started = Instant::now();
    while std::fs::read_to_string(log).unwrap_or_default() != text {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the log never read {text:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The live dead man's switch `run` (pid `run`) started: its child whose
/// command is the switch's script.
#[cfg(target_os = "linux")]
fn switch_of(run: u32) -> Option<u32> {
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // `pid (comm) state ppid ...`: after the last `)`.
            let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
            let (state, ppid) = (fields.next()?, fields.next()?.parse::<u32>().ok()?);
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let switch = String::from_utf8_lossy(&cmdline).contains("trap ''");
            (ppid == run && state != "Z" && switch).then_some(pid)
        })
}

/// In a batch, the deliveries whose handler had not started when SIGTERM came
/// are not run: each gets its verdict (`failed`, retried), none is left out.
#[test]
fn sigterm_in_a_batch_runs_no_further_handler_and_reports_each_line() {
    let (child, log, stdin) = slow_run(
        "sigterm-batch",
        &["--batch", "3"],
        &["batch-1", "batch-2", "batch-3"],
    );
    signal(&child, "-TERM");
    let out = wait_within(child, 30);
    drop(stdin);
    let verdicts = decisions(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(143), "{stderr}");
    let outcomes: Vec<&str> = verdicts
        .iter()
        .map(|v| v["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(
        outcomes,
        ["run-ok", "run-failed", "run-failed"],
        "{verdicts:?}"
    );
    assert!(
        verdicts[1]["reason"]
            .as_str()
            .unwrap()
            .contains("not run: bq-dedupe is stopping (SIGTERM)")
    );
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "start\neffect\n");
}

/// With stderr a closed pipe (a supervisor's log stream gone), the signal
/// thread's message panicked, the thread died, and every later SIGINT or
/// SIGTERM was ignored (an adversarial review's finding). A signal still stops
/// the run, with its exit status.
#[test]
fn a_signal_stops_the_run_even_when_stderr_is_a_closed_pipe() {
    let dir = scratch("sigterm-epipe");
    let store = format!("sqlite:{}", dir.join("db").display());
    let mut child = common::command()
        .args(["run", "--store", &store, "--exec", "cat >/dev/null"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stderr.take()); // the reader goes away
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{}", envelope("epipe-1", 10)).unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut first = [0u8; 1];
    std::io::Read::read_exact(&mut out, &mut first).unwrap(); // its verdict is out
    signal(&child, "-TERM");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "SIGTERM was ignored"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    drop(stdin);
    assert_eq!(status.code(), Some(143));
}
