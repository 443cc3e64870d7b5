//! The printing thread of `bq-dedupe run`: verdicts are formatted and written
//! off the deciding thread, so the next batch is decided while this one is
//! printed. One channel, so verdicts come out in the order they were decided.

use std::collections::BTreeMap;
use std::io::{BufWriter, Write};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::thread::JoinHandle;

use anyhow::{Result, anyhow};

use super::Verdict;

/// How many verdicts each decision (`run`, `skip`, ...) got.
pub type Counts = BTreeMap<&'static str, u64>;

/// Groups of verdicts in flight to the printing thread: enough to overlap
/// deciding and printing, few enough to hold little memory.
const IN_FLIGHT: usize = 4;

pub struct Printer {
    send: SyncSender<Vec<Verdict>>,
    thread: JoinHandle<std::io::Result<Counts>>,
}

impl Printer {
    /// Starts the printing thread on stdout.
    pub fn spawn() -> Self {
        let (send, receive) = mpsc::sync_channel(IN_FLIGHT);
        let thread = std::thread::spawn(move || print(receive));
        Printer { send, thread }
    }

    /// Has `verdicts` printed and flushed (what is printed has been decided).
    /// One call per group of batches, not per batch: each hand-off may wake the
    /// thread, which costs microseconds. An error means the printing thread has
    /// stopped (stdout closed or failing): [`Printer::finish`] says why.
    pub fn print(&self, verdicts: Vec<Verdict>) -> Result<(), Stopped> {
        self.send.send(verdicts).map_err(|_| Stopped)
    }

    /// Prints what is queued, flushes, and hands back the counts, or the error
    /// that stopped the printing thread.
    pub fn finish(self) -> Result<Counts> {
        drop(self.send);
        match self.thread.join() {
            Ok(done) => Ok(done?),
            Err(_) => Err(anyhow!("the printing thread panicked")),
        }
    }
}

/// The printing thread stopped before all verdicts were sent.
#[derive(Debug)]
pub struct Stopped;

fn print(receive: Receiver<Vec<Verdict>>) -> std::io::Result<Counts> {
    let mut out = BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
    let mut counts = Counts::new();
    for verdicts in receive {
        for verdict in &verdicts {
            *counts.entry(verdict.1).or_default() += 1;
            write_verdict(&mut out, verdict)?;
        }
        out.flush()?;
    }
    Ok(counts)
}

/// Writes one verdict as a JSON line: `{"decision","id","line","outcome","reason"}`
/// (the keys in this order, as before).
fn write_verdict(out: &mut impl Write, v: &Verdict) -> std::io::Result<()> {
    let (line, decision, code, reason, id) = v;
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
