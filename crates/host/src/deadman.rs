//! A dead man's switch for the `--exec` handler: a small process that outlives
//! `run` and kills the running handler's process group when `run` dies while
//! a handler runs (`kill -9`, a crash, the OOM killer). The parent-death
//! signal takes only the handler's shell; what that shell forked and waits for
//! (`python3 h.py`, `sh h.sh`, a pipeline) went on beside the redelivery.
//!
//! The switch is `sh` reading lines on a pipe only `run` holds (close-on-exec,
//! so no handler inherits it): `S GROUP` when a handler has started, `E` when
//! it has exited (before it is reaped, so the group is still the handler's).
//! At the end of its input, `run` gone, a group left started is killed. It is
//! in a process group of its own, out of a terminal's Ctrl-C.

use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;

/// Signals a terminal or a supervisor sends the whole group are ignored: the
/// switch ends only when its input does (`run` gone), or by SIGKILL.
const SWITCH: &str = r#"trap '' INT HUP TERM
group=
while read -r what g; do
  case $what in S) group=$g ;; *) group= ;; esac
done
[ -z "$group" ] || kill -s KILL -- "-$group" 2>/dev/null"#;

/// The switch, started before the first handler.
static SWITCH_PROCESS: Mutex<Option<Child>> = Mutex::new(None);

/// Starts the switch if it is not running, before a handler is spawned (so
/// that no handler runs without one).
pub(crate) fn ready() {
    let mut switch = SWITCH_PROCESS.lock().unwrap_or_else(|e| e.into_inner());
    if switch.is_none() {
        *switch = start();
    }
}

/// The handler whose process group is `group` has started.
pub(crate) fn armed(group: u32) {
    send(&format!("S {group}\n"));
}

/// The handler has exited (not yet reaped).
pub(crate) fn disarmed() {
    send("E\n");
}

/// Sends `line`; a switch that has died (killed by hand) is reaped and
/// started again, and the line sent to the new one. Best effort beyond that:
/// the handler runs either way (the parent-death signal still takes its shell).
fn send(line: &str) {
    let mut switch = SWITCH_PROCESS.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..2 {
        if switch.is_none() {
            *switch = start();
        }
        let Some(process) = switch.as_mut() else {
            return;
        };
        let sent = process
            .stdin
            .as_mut()
            .is_some_and(|input| input.write_all(line.as_bytes()).is_ok());
        if sent {
            return;
        }
        let _ = process.kill();
        let _ = process.wait();
        *switch = None;
    }
}

fn start() -> Option<Child> {
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(SWITCH)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    // Not waited for while it runs: it ends when `run` (its input's only
    // writer) does.
    command.spawn().ok()
}
