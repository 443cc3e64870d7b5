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
use std::process::{ChildStdin, Command, Stdio};
use std::sync::Mutex;

const SWITCH: &str = r#"trap '' INT HUP
group=
while read -r what g; do
  case $what in S) group=$g ;; *) group= ;; esac
done
[ -z "$group" ] || kill -s KILL -- "-$group" 2>/dev/null"#;

/// The switch's input; started with the first handler.
static INPUT: Mutex<Option<ChildStdin>> = Mutex::new(None);

/// The handler whose process group is `group` has started.
pub(crate) fn armed(group: u32) {
    send(&format!("S {group}\n"));
}

/// The handler has exited (not yet reaped).
pub(crate) fn disarmed() {
    send("E\n");
}

/// Best effort: a switch that cannot start or has died is started again at
/// the next line; the handler runs either way (the parent-death signal still
/// takes its shell).
fn send(line: &str) {
    let mut input = INPUT.lock().unwrap_or_else(|e| e.into_inner());
    if input.is_none() {
        *input = start();
    }
    if let Some(pipe) = input.as_mut()
        && pipe.write_all(line.as_bytes()).is_err()
    {
        *input = None;
    }
}

fn start() -> Option<ChildStdin> {
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(SWITCH)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    // Never waited for: it ends when `run` (its input's only writer) does.
    command.spawn().ok()?.stdin.take()
}
