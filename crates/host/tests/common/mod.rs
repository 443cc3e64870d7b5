//! Shared by the `bq-dedupe` end-to-end tests: the binary, scratch folders, and
//! running it with input on stdin.

#![allow(dead_code)] // each test file uses its own subset

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_bq-dedupe");

/// A fresh directory under target/ for one test, unique per process and call.
pub fn scratch(name: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!(
        "../../target/host-tests/{name}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The compilation cache the tests' `bq-dedupe` processes share.
pub fn test_cache_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/host-tests/compile-cache")
}

/// Runs `bq-dedupe ARGS` with `stdin` written from a thread (so a large input
/// cannot deadlock against a full stdout pipe) and waits for it.
pub fn bq(args: &[&str], stdin: &str) -> Output {
    bq_with_env(&[], args, stdin)
}

/// [`bq`] with these environment variables set.
pub fn bq_with_env(vars: &[(&str, &str)], args: &[&str], stdin: &str) -> Output {
    fed(command().envs(vars.iter().copied()).args(args), stdin)
}

/// Runs `cmd` with `stdin` written from a thread and waits for it (a run
/// refused before reading its input breaks the pipe: not an error).
pub fn fed(cmd: &mut Command, stdin: &str) -> Output {
    let mut child = piped(cmd);
    let mut input = child.stdin.take().unwrap();
    let stdin = stdin.to_owned();
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(stdin.as_bytes());
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    out
}

/// A `bq-dedupe` command whose compiled components are cached under target/
/// (not in the user's cache), shared by every test.
pub fn command() -> Command {
    let mut cmd = Command::new(BIN);
    cmd.env("BQ_DEDUPE_CACHE_DIR", test_cache_dir());
    // Each test names its store (or the default's); none from the environment.
    cmd.env_remove("BQ_DEDUPE_STORE");
    cmd
}

/// `bq-dedupe ARGS` started now, every stream piped.
pub fn spawn(args: &[&str]) -> Child {
    piped(command().args(args))
}

fn piped(command: &mut Command) -> Child {
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("bq-dedupe starts")
}

/// The JSON verdicts `run` printed, one per line.
pub fn decisions(out: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON decision: {l:?}: {e}"))
        })
        .collect()
}

/// Waits for `child` while reading its peak resident size (`VmHWM`, kB) from
/// /proc as it runs: its output, and that peak (0 when it could not be read).
pub fn wait_with_peak_kb(child: Child) -> (Output, u64) {
    let pid = child.id();
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || done.send(child.wait_with_output()));
    let mut peak_kb = 0u64;
    loop {
        if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
            let hwm = status.lines().find_map(|l| l.strip_prefix("VmHWM:"));
            if let Some(kb) = hwm.and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            {
                peak_kb = peak_kb.max(kb);
            }
        }
        match finished.recv_timeout(std::time::Duration::from_millis(20)) {
            Ok(out) => return (out.unwrap(), peak_kb),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => continue,
            Err(e) => panic!("{e}"),
        }
    }
}
