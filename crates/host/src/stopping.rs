//! `bq-dedupe run` on SIGINT and SIGTERM. The first signal stops the run from
//! taking more work: the handler running goes on to its end, its verdict is
//! recorded and printed, a handler not yet started is not run (its delivery
//! `failed`, to be retried), and the run exits 128 + the signal. A second
//! signal kills the running `--exec` handler's process group and exits at once.
//! Before, the handler (in a process group of its own, out of a Ctrl-C's reach)
//! went on after the run died, its claim no longer renewed, beside the
//! redelivery.

use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};

/// The signal that asked the run to stop (0: none yet).
static REQUESTED: AtomicI32 = AtomicI32::new(0);
/// The running `--exec` handler's process group (0: none).
static RUNNING_GROUP: AtomicU32 = AtomicU32::new(0);

/// The signal that asked the run to stop, once one has.
pub fn requested() -> Option<i32> {
    match REQUESTED.load(Ordering::SeqCst) {
        0 => None,
        signal => Some(signal),
    }
}

/// Why a handler was not started: the run is stopping.
pub fn not_run(signal: i32) -> String {
    format!(
        "not run: bq-dedupe is stopping ({}); the delivery is retried",
        name(signal)
    )
}

/// The signal's name, as `kill -l` gives it.
pub fn name(signal: i32) -> &'static str {
    match signal {
        2 => "SIGINT",
        15 => "SIGTERM",
        _ => "a signal",
    }
}

/// The `--exec` handler's process group, from its start until it has exited
/// (its pid not yet reaped, so the group cannot be another's).
pub(crate) fn running(group: u32) {
    RUNNING_GROUP.store(group, Ordering::SeqCst);
}

pub(crate) fn finished() {
    RUNNING_GROUP.store(0, Ordering::SeqCst);
}

/// Handles SIGINT and SIGTERM from now on; `wake` is called at the first, to
/// wake a run waiting for input.
#[cfg(unix)]
pub fn install(wake: impl Fn() + Send + 'static) -> std::io::Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])?;
    std::thread::spawn(move || {
        for signal in signals.forever() {
            if REQUESTED
                .compare_exchange(0, signal, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                // Not eprintln!: it panics when stderr is a closed pipe, and
                // this thread must live on to handle the next signal.
                crate::say(&format!(
                    "bq-dedupe: {}: stopping after the delivery in progress (again to kill its handler)",
                    name(signal)
                ));
                wake();
                continue;
            }
            let group = RUNNING_GROUP.load(Ordering::SeqCst);
            if group != 0 {
                crate::exec::kill_group(group);
            }
            crate::say(&format!(
                "bq-dedupe: {} again: stopped at once{}; the delivery in progress was not recorded (its claim lapses), and the successes of its batch before it may not have been (those a checkpoint did not write run again when fed again; every line after the last one printed; `show` tells which)",
                name(signal),
                if group != 0 {
                    ", its handler killed"
                } else {
                    ""
                }
            ));
            std::process::exit(128 + signal);
        }
    });
    Ok(())
}

#[cfg(not(unix))]
pub fn install(_wake: impl Fn() + Send + 'static) -> std::io::Result<()> {
    Ok(())
}
