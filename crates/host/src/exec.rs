//! The `--exec` handler's process: `sh -c CMD` with the envelope on its stdin.
//!
//! Its stdin is written from a thread of its own while its stderr is drained
//! into a bounded tail on another, so neither side waits on a full pipe. It is
//! done when it exits, whatever it left running (a background child keeping
//! the pipes open is not waited for); at its timeout, or when it failed, it is
//! killed with its whole process group (nothing of a failed run goes on beside
//! its retry).

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How much of a handler's stderr is kept (its end, for the failure's reason).
const TAIL_BYTES: usize = 4096;
/// How much of that tail a reason shows.
const REASON_CHARS: usize = 200;
/// How long, after the handler exits, its stderr may take to reach its end
/// (a background child holding it open is not waited for longer).
const STDERR_GRACE: Duration = Duration::from_millis(100);

/// The command as `sh -c` gets it: a program named by its path and nothing
/// else (`./handler.sh`, the README's form) with `exec` before it, so the
/// shell becomes the handler and the handler itself dies with `run` (the
/// parent-death signal is kept across exec). Without it some shells (dash,
/// Debian's `sh`) fork the program and wait, and a `kill -9` of `run` took
/// only the shell: the handler went on beside the redelivery (a first user's
/// trial). Anything with arguments is left as written: a second line would
/// never run after `exec` (its message recorded as done), and a program such
/// as `setsid` forks and returns at once when it leads the process group
/// that the shell led (its failure reported as `run-ok`; a review found both).
pub fn exec_form(cmd: &str) -> std::borrow::Cow<'_, str> {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_./-+@%,:".contains(c);
    match cmd.contains('/') && cmd.chars().all(plain) {
        true => std::borrow::Cow::Owned(format!("exec {cmd}")),
        false => std::borrow::Cow::Borrowed(cmd),
    }
}

/// A shell command run per delivery (`bq-dedupe run --exec`).
#[derive(Debug, Clone)]
pub struct ExecHandler {
    /// The command, for `sh -c`.
    pub cmd: String,
    /// How long one delivery's handler may run before it is killed.
    pub timeout: Duration,
    /// Its stdout and stderr go on to ours (stderr) as well.
    pub show_output: bool,
}

impl ExecHandler {
    /// Runs the command on `envelope`: `Ok` when it exits 0; otherwise why,
    /// with the end of its stderr.
    pub fn handle(&self, envelope: &str, trace: &[(&str, String)]) -> Result<(), String> {
        #[cfg(unix)]
        crate::deadman::ready();
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(exec_form(&self.cmd).as_ref())
            // The store's spec (its password) is ours, not the handler's.
            .env_remove(crate::STORE_ENV)
            // Its delivery's trace context (`TRACEPARENT`), when `run` traces.
            .envs(trace.iter().map(|(var, value)| (var, value)))
            .stdin(Stdio::piped())
            .stdout(match self.show_output {
                true => Stdio::from(std::io::stderr()),
                false => Stdio::null(),
            })
            .stderr(Stdio::piped());
        // Its own process group, so a timeout kills whatever it started too.
        #[cfg(unix)]
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        #[cfg(target_os = "linux")]
        die_with_parent(&mut command);
        let mut child = command
            .spawn()
            .map_err(|e| format!("could not start handler: {e}"))?;
        feed(&mut child, envelope);
        let tail = Tail::drain(&mut child, self.show_output);
        let pid = child.id();
        crate::stopping::running(pid);
        #[cfg(unix)]
        crate::deadman::armed(pid);
        // A thread waits for the exit without reaping it, so the pid (and its
        // group) stays the handler's until this thread reaps it: a kill at the
        // deadline can never reach a process that took the pid over.
        let (exited, exit) = mpsc::channel();
        std::thread::spawn(move || exited.send(wait_unreaped(pid)));
        let waited = exit.recv_timeout(self.timeout);
        // Timed out, or failed: what it started goes with it (before the reap,
        // while its group id is still its own).
        if matches!(waited, Err(RecvTimeoutError::Timeout) | Ok(false)) {
            kill_group(pid);
        }
        crate::stopping::finished();
        #[cfg(unix)]
        crate::deadman::disarmed();
        let status = child
            .wait()
            .map_err(|e| format!("handler did not finish: {e}"))?;
        match waited {
            Ok(_) => {}
            Err(RecvTimeoutError::Timeout) => {
                return Err(format!(
                    "handler timed out after {} and was killed{}",
                    shown(self.timeout),
                    tail.reason(STDERR_GRACE)
                ));
            }
            // The waiting thread could not wait: reaped above all the same.
            Err(RecvTimeoutError::Disconnected) => {}
        }
        if status.success() {
            return Ok(());
        }
        Err(format!(
            "handler exited with {}{}",
            exited_with(status),
            tail.reason(STDERR_GRACE)
        ))
    }
}

/// Writes `envelope` to the child's stdin as one line (a newline after it, so
/// a handler that reads a line gets it), from a thread, then closes it. A
/// handler that does not read its input closes the pipe early: not an error.
/// The thread is not joined: a background child holding the pipe unread must
/// not hold the delivery.
fn feed(child: &mut Child, envelope: &str) {
    if let Some(mut stdin) = child.stdin.take() {
        let input = format!("{envelope}\n");
        std::thread::spawn(move || {
            let _ = stdin.write_all(input.as_bytes());
        });
    }
}

/// The end of a child's stderr, read on a thread of its own.
struct Tail {
    kept: Arc<Mutex<VecDeque<u8>>>,
    ended: mpsc::Receiver<()>,
}

impl Tail {
    /// `echo`: each chunk also goes on to our stderr.
    fn drain(child: &mut Child, echo: bool) -> Tail {
        let kept = Arc::new(Mutex::new(VecDeque::with_capacity(TAIL_BYTES)));
        let (end, ended) = mpsc::channel();
        if let Some(mut stderr) = child.stderr.take() {
            let kept = kept.clone();
            std::thread::spawn(move || {
                let mut chunk = [0u8; 8192];
                while let Ok(n @ 1..) = stderr.read(&mut chunk) {
                    if echo {
                        let _ = std::io::stderr().write_all(&chunk[..n]);
                    }
                    let mut tail = kept.lock().unwrap_or_else(|e| e.into_inner());
                    tail.extend(&chunk[..n]);
                    let over = tail.len().saturating_sub(TAIL_BYTES);
                    tail.drain(..over);
                }
                let _ = end.send(());
            });
        }
        Tail { kept, ended }
    }

    /// `": <the last lines of stderr>"`, once stderr ended or `grace` passed;
    /// empty when it said nothing.
    fn reason(&self, grace: Duration) -> String {
        let _ = self.ended.recv_timeout(grace);
        let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let text = String::from_utf8_lossy(&kept.iter().copied().collect::<Vec<u8>>()).into_owned();
        let text = text.trim();
        let start = text
            .char_indices()
            .rev()
            .nth(REASON_CHARS - 1)
            .map_or(0, |(i, _)| i);
        match &text[start..] {
            "" => String::new(),
            tail => format!(": {tail}"),
        }
    }
}

#[cfg(unix)]
fn exited_with(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("status {code}"),
        (None, Some(signal)) => format!("signal {signal}"),
        _ => status.to_string(),
    }
}

#[cfg(not(unix))]
fn exited_with(status: ExitStatus) -> String {
    status.to_string()
}

/// Returns once process `pid` (our child) has exited, leaving it to be
/// reaped: whether it exited 0 (`true` too when waiting failed: unknown).
#[cfg(unix)]
fn wait_unreaped(pid: u32) -> bool {
    loop {
        // SAFETY: `info` is a plain C struct waitid fills; WNOWAIT leaves the
        // child to `Child::wait`.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let done = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        if done == 0 {
            // SAFETY: waitid filled `info` for an exited child.
            return info.si_code == libc::CLD_EXITED && unsafe { info.si_status() } == 0;
        }
        if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return true;
        }
    }
}

/// Elsewhere: returns at once, so there is no timeout (the `Child::wait`
/// after it blocks until the exit), as before process groups.
#[cfg(not(unix))]
fn wait_unreaped(_pid: u32) -> bool {
    true
}

/// The handler's shell is killed when this thread's process dies, `kill -9`
/// included: an orphan would go on beside the redelivery. (What the shell has
/// started by then is not: the signal is the child's alone; the dead man's
/// switch, `crate::deadman`, kills its whole group.)
#[cfg(target_os = "linux")]
fn die_with_parent(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: prctl and getppid are async-signal-safe, as pre_exec requires.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent died before the prctl took hold.
            if libc::getppid() != parent {
                return Err(std::io::Error::other("bq-dedupe exited"));
            }
            Ok(())
        });
    }
}

/// Kills the process group `pgid` (the handler and all it started).
#[cfg(unix)]
pub(crate) fn kill_group(pgid: u32) {
    // SAFETY: killpg only sends a signal; a group already gone is ESRCH.
    unsafe {
        libc::killpg(pgid as libc::pid_t, libc::SIGKILL);
    }
}

#[cfg(not(unix))]
pub(crate) fn kill_group(pid: u32) {
    let _ = Command::new("taskkill")
        .args(["/F", "/T", "/PID", &pid.to_string()])
        .status();
}

/// `1s`, `250ms`, `5m`: a duration as the flags write it.
pub fn shown(d: Duration) -> String {
    let ms = d.as_millis();
    match ms {
        ms if ms % 60_000 == 0 && ms > 0 => format!("{}m", ms / 60_000),
        ms if ms % 1000 == 0 && ms > 0 => format!("{}s", ms / 1000),
        ms => format!("{ms}ms"),
    }
}

#[cfg(test)]
mod tests {
    use super::exec_form;

    #[test]
    fn a_program_by_its_path_is_execed_and_anything_else_left_as_written() {
        for cmd in [
            "./handler.sh",
            "/bin/cat",
            "examples/demo-handler.sh",
            "bin/h-1.2",
        ] {
            assert_eq!(exec_form(cmd), format!("exec {cmd}"), "{cmd}");
        }
        for cmd in [
            "cat",
            "exit 1",
            "cd /tmp",
            "./h.sh --flag",
            "A=1 ./h.sh",
            "./a.sh && ./b.sh",
            "cat >/dev/null; exit 0",
            "./h.sh | tee log",
            "python3 h.py",
            "mkdir -p out\n./step2.sh",
            "./step1.sh\n./step2.sh",
            "setsid ./slow.sh",
            "'./h.sh'",
            "",
        ] {
            assert_eq!(exec_form(cmd), cmd, "{cmd:?}");
        }
    }
}
