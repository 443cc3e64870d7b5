//! The printing thread of `bq-dedupe run`: verdicts are formatted and written
//! off the deciding thread, so the next batch is decided while this one is
//! printed. One channel, so verdicts come out in the order they were decided.

use std::collections::BTreeMap;
use std::io::{BufWriter, Write};
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
    thread: Option<JoinHandle<std::io::Result<Counts>>>,
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
        }
    }

    /// Queues a group of verdicts; the printing thread writes and flushes each
    /// group in turn (so what is printed has been decided). One call per group
    /// of batches, not per batch: each hand-off may wake the thread, which costs
    /// microseconds. An error means the printing thread has stopped (stdout
    /// closed or failing): [`Printer::finish`] says why.
    pub fn print(&self, verdicts: Vec<LineVerdict>) -> Result<(), Stopped> {
        let send = self.send.as_ref().ok_or(Stopped)?;
        send.send(verdicts).map_err(|_| Stopped)
    }

    /// Waits until everything queued is printed and flushed, and hands back the
    /// counts, or the error that stopped the printing thread.
    pub fn finish(mut self) -> Result<Counts> {
        drop(self.send.take());
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(done)) => Ok(done?),
            Some(Err(_)) => Err(anyhow!("the printing thread panicked")),
            None => Err(anyhow!("the printing thread was already finished")),
        }
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

fn print(receive: &Receiver<Vec<LineVerdict>>) -> std::io::Result<Counts> {
    // Stdout itself, not its lock: the lock is taken per write of the buffer,
    // so nothing else that prints can block on this thread for the whole run.
    let mut out = BufWriter::with_capacity(1 << 16, std::io::stdout());
    let mut counts = Counts::new();
    for verdicts in receive {
        for verdict in &verdicts {
            tally(&mut counts, verdict.decision, verdict.outcome);
            write_verdict(&mut out, verdict)?;
        }
        out.flush()?;
    }
    Ok(counts)
}

/// Counts a verdict under its decision, and two outcomes among `run` apart
/// too: `lease-lost`, the one under which an effect may have happened twice,
/// and `unrecorded`, a run whose record the store did not take (a redelivery
/// runs it again, unless the write had landed after all).
fn tally(counts: &mut Counts, decision: &'static str, outcome: &str) {
    *counts.entry(decision).or_default() += 1;
    let apart = match outcome {
        "run-ok-lease-lost" => "lease-lost",
        "run-ok-unrecorded" => "unrecorded",
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
            tally(&mut counts, "run", outcome);
        }
        tally(&mut counts, "skip", "skip");
        let expected = [
            ("lease-lost", 1),
            ("run", 4),
            ("skip", 1),
            ("unrecorded", 1),
        ];
        assert_eq!(counts, Counts::from(expected));
    }
}
