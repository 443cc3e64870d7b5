//! The printing thread of `bq-dedupe run`: verdicts are formatted and written
//! off the deciding thread, so the next batch is decided while this one is
//! printed. One channel, so verdicts come out in the order they were decided.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::io::Write;
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::thread::JoinHandle;

use anyhow::{Result, anyhow};

use super::{Event, LineVerdict};

/// How many verdicts each decision (`run`, `skip`, ...) got.
pub type Counts = BTreeMap<&'static str, u64>;

/// Groups of verdicts queued for the printing thread beside the one it is
/// writing: one is enough to overlap deciding and printing, and it bounds what
/// a closed stdout leaves decided but unprinted.
const QUEUED: usize = 1;

pub struct Printer {
    /// Both `None` once finished.
    send: Option<SyncSender<Vec<LineVerdict>>>,
    thread: Option<JoinHandle<Result<Counts, Failed>>>,
    /// The line of the last verdict handed over: every line decided (and
    /// recorded) up to it, printed or not.
    decided_to: Cell<u64>,
}

/// Why the printing thread stopped, and the line of the last verdict it had
/// written whole to stdout (0: none).
struct Failed {
    error: std::io::Error,
    printed_to: u64,
}

impl Printer {
    /// Starts the printing thread on stdout. If printing fails (stdout closed),
    /// it stops taking verdicts and tells the deciding loop through `notify`,
    /// which may be waiting for input that is not coming.
    pub fn spawn(notify: SyncSender<Event>) -> Self {
        let (send, receive) = mpsc::sync_channel(QUEUED);
        let thread = std::thread::spawn(move || {
            let printed = print(&receive);
            // Stop taking verdicts first, so a deciding loop blocked on `print`
            // wakes up (to an error) instead of waiting on a full queue.
            drop(receive);
            if printed.is_err() {
                let _ = notify.send(Event::PrinterStopped);
            }
            printed
        });
        Printer {
            send: Some(send),
            thread: Some(thread),
            decided_to: Cell::new(0),
        }
    }

    /// Queues a group of verdicts; the printing thread writes and flushes each
    /// group in turn (so what is printed has been decided). One call per group
    /// of batches, not per batch: each hand-off may wake the thread, which costs
    /// microseconds. An error means the printing thread has stopped (stdout
    /// closed or failing): [`Printer::finish`] says why.
    pub fn print(&self, verdicts: Vec<LineVerdict>) -> Result<(), Stopped> {
        if let Some(last) = verdicts.last() {
            self.decided_to.set(last.line);
        }
        let send = self.send.as_ref().ok_or(Stopped)?;
        send.send(verdicts).map_err(|_| Stopped)
    }

    /// Waits until everything queued is printed and flushed, and hands back the
    /// counts, or the error that stopped the printing thread with what it left
    /// unprinted (`run | head`): those lines were decided, what they recorded
    /// is skipped by a rerun, and the rest runs again (a failure, a fail-open
    /// line, a success the store did not record).
    pub fn finish(mut self) -> Result<Counts> {
        drop(self.send.take());
        let Failed { error, printed_to } = match self.thread.take().map(JoinHandle::join) {
            Some(Ok(Ok(counts))) => return Ok(counts),
            Some(Ok(Err(failed))) => failed,
            Some(Err(_)) => return Err(anyhow!("the printing thread panicked")),
            None => return Err(anyhow!("the printing thread was already finished")),
        };
        let decided_to = self.decided_to.get();
        let printed = match printed_to {
            0 => "no verdict printed".to_owned(),
            // Written into the pipe: a reader that stopped early read fewer.
            line => format!(
                "verdicts handed to stdout up to line {line} (a reader that stopped early \
                 read fewer)"
            ),
        };
        let unprinted = if decided_to > printed_to {
            format!(
                " (the verdicts of lines {} to {decided_to} are lost; `show` tells which \
                 of their ids were recorded)",
                printed_to + 1
            )
        } else {
            String::new()
        };
        Err(anyhow!(
            "writing the verdicts failed: {error}. Stopped: {printed}; decided up to line \
             {decided_to}{unprinted}; feed them again from line {}: a rerun skips the ids \
             recorded and runs the rest again (a failure, a fail-open line, a success the \
             store did not record)",
            printed_to + 1
        ))
    }
}

impl Drop for Printer {
    /// A run that ends without `finish` (an error, a panic) still prints what
    /// it decided.
    fn drop(&mut self) {
        drop(self.send.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The printing thread stopped before all verdicts were sent.
#[derive(Debug)]
pub struct Stopped;

fn print(receive: &Receiver<Vec<LineVerdict>>) -> Result<Counts, Failed> {
    let mut counts = Counts::new();
    // A group's text, and where each of its lines ends in it: a write that
    // fails part way says up to which line was written.
    let mut text = Vec::with_capacity(1 << 16);
    let mut ends = Vec::new();
    let mut printed_to = 0;
    for verdicts in receive {
        text.clear();
        ends.clear();
        for verdict in &verdicts {
            tally(
                &mut counts,
                verdict.decision,
                verdict.outcome,
                verdict.ran_before_trap,
            );
            // Into a Vec: cannot fail.
            let _ = write_verdict(&mut text, verdict);
            ends.push((text.len(), verdict.line));
        }
        // Stdout itself, not its lock: the lock is taken per write, so nothing
        // else that prints can block on this thread for the whole run.
        let mut out = std::io::stdout();
        let mut written = 0;
        let failed = loop {
            if written == text.len() {
                break out.flush().err();
            }
            match out.write(&text[written..]) {
                Ok(0) => break Some(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => written += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => break Some(e),
            }
        };
        let whole = ends.iter().take_while(|(end, _)| *end <= written).last();
        printed_to = whole.map_or(printed_to, |&(_, line)| line);
        if let Some(error) = failed {
            return Err(Failed { error, printed_to });
        }
    }
    Ok(counts)
}

/// Counts a verdict under its decision, and two outcomes among `run` apart
/// too: `lease-lost`, the one under which an effect may have happened twice,
/// and `unrecorded`, a run whose record the store did not take (a redelivery
/// runs it again, unless the write had landed after all), which a success
/// whose call then trapped (`ran_before_trap`) may be too.
fn tally(counts: &mut Counts, decision: &'static str, outcome: &str, ran_before_trap: bool) {
    *counts.entry(decision).or_default() += 1;
    let apart = match outcome {
        "run-ok-lease-lost" => "lease-lost",
        "run-ok-unrecorded" => "unrecorded",
        _ if ran_before_trap => "unrecorded",
        _ => return,
    };
    *counts.entry(apart).or_default() += 1;
}

/// Writes one verdict as a JSON line: `{"decision","id","line","outcome","reason"}`
/// (the keys in this order, as before).
fn write_verdict(out: &mut impl Write, v: &LineVerdict) -> std::io::Result<()> {
    let LineVerdict {
        line,
        decision,
        outcome: code,
        reason,
        id,
        ..
    } = v;
    let string = |out: &mut dyn Write, s: &str| -> std::io::Result<()> {
        serde_json::to_writer(out, s).map_err(std::io::Error::other)
    };
    let option = |out: &mut dyn Write, s: &Option<String>| match s {
        Some(s) => string(out, s),
        None => out.write_all(b"null"),
    };
    out.write_all(b"{\"decision\":")?;
    string(out, decision)?;
    out.write_all(b",\"id\":")?;
    option(out, id)?;
    write!(out, ",\"line\":{line},\"outcome\":")?;
    string(out, code)?;
    out.write_all(b",\"reason\":")?;
    option(out, reason)?;
    out.write_all(b"}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run the store did not record was counted as a plain `run`: a
    /// summary of `{"run":40}` and exit 0 hid it (a trial's finding).
    #[test]
    fn the_summary_counts_unrecorded_and_lease_lost_runs_apart() {
        let mut counts = Counts::new();
        for outcome in ["run-ok", "run-ok-unrecorded", "run-ok-lease-lost", "run-ok"] {
            tally(&mut counts, "run", outcome, false);
        }
        tally(&mut counts, "skip", "skip", false);
        // A success whose call then trapped: retried, and perhaps unrecorded
        // (it was counted only as `failed`: a review).
        tally(&mut counts, "failed", "trap", true);
        tally(&mut counts, "failed", "trap", false);
        let expected = [
            ("failed", 2),
            ("lease-lost", 1),
            ("run", 4),
            ("skip", 1),
            ("unrecorded", 2),
        ];
        assert_eq!(counts, Counts::from(expected));
    }
}
