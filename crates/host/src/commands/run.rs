//! `bq-dedupe run`: dedupe a stream of envelopes (JSON lines) through the
//! component, one JSON decision per line on stdout, a summary on stderr.

mod args;
mod printer;
mod verdict;

use std::collections::VecDeque;
use std::io::IsTerminal;
use std::path::Path;
use std::process::ExitCode;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::Instant;

use anyhow::{Result, bail};
use bq_dedupe::OutcomeKind;
use indicatif::{ProgressBar, ProgressStyle};

use bq_dedupe_host::handler::{ExecHandler, Handler, Plugin};
use bq_dedupe_host::runtime::{ComponentSource, Runtime, guard_options};
use bq_dedupe_host::stopping;

pub use args::RunArgs;
use printer::{Counts, Printer, Stopped};
use verdict::{LineVerdict, decide};

/// What wakes the deciding loop: the reader thread's lines and end, or the
/// printing thread stopping (stdout closed), which must end a run that may be
/// waiting for input.
enum Event {
    /// Lines read, in input order.
    Lines(Chunk),
    ReadFailed(std::io::Error),
    End,
    PrinterStopped,
    /// SIGINT or SIGTERM: decide nothing more (see `stopping`).
    Stopping,
}

/// Lines as the reader thread hands them over: blank lines dropped, the rest
/// numbered and checked for UTF-8 (a line that is not, or that was over the
/// size limit, is its rejection, reported in its turn), so the deciding thread
/// does neither.
struct Chunk {
    /// The number of the chunk's last line, blank or not.
    last: u64,
    lines: Vec<Line>,
}

/// A numbered line: its text, or why it cannot cross into the component (not
/// UTF-8, or cut at the size limit: see `Lines::cut`).
pub(super) type Line = (u64, Result<String, bq_dedupe::envelope::Rejection>);

/// Why the deciding loop stopped before the end of its input.
enum Stop {
    Read(std::io::Error),
    /// The printing thread stopped first; `Printer::finish` says why.
    Printer,
    /// This signal asked the run to stop.
    Signal(i32),
    /// The store did not record a success (`run-ok-unrecorded`); `left`: lines
    /// of its group were not decided.
    Unrecorded {
        left: bool,
    },
}

impl From<Stopped> for Stop {
    fn from(_: Stopped) -> Self {
        Stop::Printer
    }
}

pub fn run(component: &ComponentSource, args: RunArgs) -> Result<ExitCode> {
    let handler = match (&args.exec, &args.handler) {
        (Some(cmd), _) => Handler::Exec(ExecHandler {
            cmd: cmd.clone(),
            timeout: args.handler_timeout,
            show_output: args.show_handler_output,
        }),
        (None, Some(path)) => Handler::Plugin(Box::new(Plugin::load(path, args.handler_timeout)?)),
        (None, None) => Handler::Mark,
    };
    // The input first: a mistyped file name must not create the store.
    let source = super::Lines::open(&args.input)?;
    // Installed first, so every error path below drops it (and so flushes).
    let otlp = bq_dedupe_host::telemetry::Otlp::from_env(args.otlp_endpoint.as_deref())?;
    let sqlite_path = args.store.strip_prefix("sqlite:");
    // Whether a SQLite file's folder is made too (the store makes missing folders).
    let new_folder = sqlite_path
        .and_then(|p| Path::new(p).parent())
        .is_some_and(|dir| !dir.as_os_str().is_empty() && !dir.exists());
    let (store, made) = bq_dedupe_host::open_or_make_store(&args.store)?;
    if made {
        // Said, so that a mistyped path or table is seen: every id of the input runs.
        let place =
            sqlite_path.map_or_else(|| bq_dedupe_host::shown_spec(&args.store), str::to_owned);
        let folder = if new_folder { ", nor its folder" } else { "" };
        bq_dedupe_host::say(&format!(
            "bq-dedupe: no store was at {place}{folder}: a new, empty one is made there"
        ));
    }
    if args.claim && !bq_dedupe::Store::capabilities(&store).claim {
        bail!(
            "store {} cannot claim",
            bq_dedupe_host::shown_spec(&args.store)
        );
    }
    if args.claim && !bq_dedupe::Store::capabilities(&store).renew {
        // The PHP SDK's format: a claim is `1` for every claimer.
        bq_dedupe_host::say(&format!(
            "bq-dedupe: store {} does not renew or fence claims: a batch whose handlers \
             run past --lease ({}) can run beside a redelivery (told by the clock alone: a \
             success written past the lease is run-ok-lease-lost); use a lease longer than \
             the slowest batch",
            bq_dedupe_host::shown_spec(&args.store),
            bq_dedupe_host::exec::shown(args.lease)
        ));
    }
    if let Some(format) = bq_dedupe::Store::shared_format(&store).filter(|_| args.fingerprint) {
        bail!(
            "--fingerprint needs our own record format; store {} keeps {format} records",
            bq_dedupe_host::shown_spec(&args.store)
        );
    }
    let caps = bq_dedupe::Store::capabilities(&store);
    if !args.claim && caps.claim && !caps.renew {
        // The PHP SDK's format: its consumers' in-flight claims (`1`) are not
        // done, so a plain run runs beside them, as PHP's plain dispatch does.
        bq_dedupe_host::say(&format!(
            "bq-dedupe: store {} keeps the PHP SDK's records: without --claim an id another \
             consumer has claimed (in flight) runs here too; pass --claim to park it",
            bq_dedupe_host::shown_spec(&args.store)
        ));
    }
    // A record that lapses before a claim would: an id delivered again after
    // the TTL runs again, run-ok both times (a trial's finding).
    if let Some(ttl) = args.ttl.filter(|ttl| args.claim && *ttl < args.lease) {
        bq_dedupe_host::say(&format!(
            "bq-dedupe: --ttl {} is shorter than --lease {}: an id's record lapses before a \
             claim on it would, and an id delivered again after the TTL runs again, reported \
             run-ok both times; give a TTL longer than the redelivery window",
            bq_dedupe_host::exec::shown(ttl),
            bq_dedupe_host::exec::shown(args.lease)
        ));
    }
    let mark_run = matches!(handler, Handler::Mark);
    let mut runtime = Runtime::load(component, store, handler)?;
    // One guard for the whole run: options checked, capabilities read, once.
    let mut opts = guard_options(&args.prefix);
    opts.ttl_ms = args.ttl.map(|d| d.as_millis() as u64);
    opts.claim_lease_ms = args.claim.then_some(args.lease.as_millis() as u64);
    opts.fingerprint = args.fingerprint;
    if let Err(refused) = runtime.open_guard(&opts)? {
        bail!(
            "the dedupe component refused the options: {}",
            refused.message
        );
    }
    // Said once the options are accepted: a refused run announces nothing.
    if mark_run {
        bq_dedupe_host::say(
            "bq-dedupe: no --exec or --handler: each new id is recorded as done without \
             running anything (a mark run)",
        );
    }
    if let Some(otlp) = &otlp {
        let mode = match args.claim {
            true => bq_dedupe::telemetry::Mode::Claiming,
            false => bq_dedupe::telemetry::Mode::SeenSet,
        };
        runtime.state().spans = Some(otlp.spans(mode));
    }

    // A spinner with the rate on a terminal; nothing when stderr is a pipe or file.
    let progress = if std::io::stderr().is_terminal() {
        ProgressBar::new_spinner()
    } else {
        ProgressBar::hidden()
    };
    progress.set_style(
        ProgressStyle::with_template("{spinner} {pos} lines, {per_sec} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    let started = Instant::now();

    // Lines are read on their own thread, so a batch can be cut by time as well
    // as by size: a slow stream gets its verdicts within `--window`. They cross
    // in chunks (what the reader has buffered, see `read_chunks`), not one by
    // one: each hand-off may wake a thread, which costs more than a line.
    // Verdicts are printed on a third (see `printer`).
    let (send, events) = mpsc::sync_channel::<Event>(2);
    let printer = Printer::spawn(send.clone());
    let wake = send.clone();
    stopping::install(move || {
        let _ = wake.try_send(Event::Stopping);
    })?;
    std::thread::spawn(move || read_chunks(source, send));
    let decided = decide_stream(&mut runtime, &events, &args, &printer, &progress);
    // No more events: a reader or printer still sending one is let go.
    drop(events);
    // Whatever ended the loop, what was decided is printed before the run ends.
    let counts = printer.finish();
    let n = match decided {
        Ok(n) => n,
        Err(Stop::Read(e)) => {
            counts?;
            return Err(e.into());
        }
        Err(Stop::Printer) => {
            return Err(counts
                .err()
                .unwrap_or_else(|| anyhow::anyhow!("the printing thread stopped")));
        }
        Err(Stop::Unrecorded { .. }) => {
            progress.finish_and_clear();
            bq_dedupe_host::say(&format!(
                "bq-dedupe: stopped: the store did not record a success (run-ok-unrecorded, \
                 its reason printed), so no more handlers run without a record; the lines \
                 after the last one printed were not decided (feed them again once the store \
                 takes writes) {}",
                serde_json::to_string(&counts?)?
            ));
            return Ok(ExitCode::from(EXIT_RETRY));
        }
        Err(Stop::Signal(signal)) => {
            progress.finish_and_clear();
            bq_dedupe_host::say(&format!(
                "bq-dedupe: stopped by {}: every line printed was decided and recorded; \
                 the lines after the last one printed were not (feed them again) {}",
                stopping::name(signal),
                serde_json::to_string(&counts?)?
            ));
            return Ok(ExitCode::from(128 + signal as u8));
        }
    };
    let counts = counts?;
    progress.finish_and_clear();
    let secs = started.elapsed().as_secs_f64();
    bq_dedupe_host::say(&format!(
        "summary: {} lines in {secs:.2}s ({:.0}/s) {}",
        n,
        n as f64 / secs.max(1e-9),
        serde_json::to_string(&counts)?
    ));
    Ok(exit_code(&counts))
}

/// The deciding loop: lines from the reader thread in batches of `--batch`, a
/// batch cut early when its first line has waited `--window`; every verdict to
/// the printer. Returns how many lines were read.
fn decide_stream(
    runtime: &mut Runtime,
    events: &Receiver<Event>,
    args: &RunArgs,
    printer: &Printer,
    progress: &ProgressBar,
) -> Result<u64, Stop> {
    let batch = args.batch() as usize;
    let mut n = 0u64;
    let mut purge = Purge::every(args.purge_every);
    // Lines read and not yet decided, oldest first; `deadline` is when the oldest
    // of them has waited `--window`.
    let mut pending: VecDeque<Line> = VecDeque::with_capacity(2 * batch);
    let mut deadline: Option<Instant> = None;
    loop {
        if let Some(signal) = stopping::requested() {
            return Err(Stop::Signal(signal));
        }
        // Every full batch is decided now; a remainder waits for more lines, for
        // its window, or for the end of input.
        if pending.len() >= batch {
            let full = pending.len() / batch * batch;
            let group = decide_group(runtime, pending.drain(..full), batch, printer);
            if ended_there(group, pending.len(), events, false)? {
                return Ok(n);
            }
            deadline = (!pending.is_empty()).then(|| Instant::now() + args.window);
        }
        purge.if_due(runtime);
        progress.set_position(n);
        let next = match deadline {
            None => events.recv().map_err(|_| RecvTimeoutError::Disconnected),
            Some(at) => events.recv_timeout(at.saturating_duration_since(Instant::now())),
        };
        match next {
            Ok(Event::Lines(chunk)) => {
                n = chunk.last;
                pending.extend(chunk.lines);
                if !pending.is_empty() {
                    deadline.get_or_insert_with(|| Instant::now() + args.window);
                }
            }
            Ok(Event::ReadFailed(e)) => {
                // What was read is decided and printed before the error ends the run.
                decide_group(runtime, pending.drain(..), batch, printer)?;
                return Err(Stop::Read(e));
            }
            // Nothing more is decided once nothing can be printed.
            Ok(Event::PrinterStopped) => return Err(Stop::Printer),
            // Checked at the top of the loop.
            Ok(Event::Stopping) => {}
            Err(RecvTimeoutError::Timeout) => {
                let group = decide_group(runtime, pending.drain(..), batch, printer);
                if ended_there(group, 0, events, false)? {
                    return Ok(n);
                }
                deadline = None;
            }
            Ok(Event::End) | Err(RecvTimeoutError::Disconnected) => {
                let group = decide_group(runtime, pending.drain(..), batch, printer);
                // Every line decided: a whole run, whatever signal came
                // during its last call (as in the branches above; it said
                // "every line printed was decided and recorded": a review).
                if ended_there(group, 0, events, true)? {
                    return Ok(n);
                }
                // A signal meanwhile may have left some of them undecided.
                return match stopping::requested() {
                    Some(signal) => Err(Stop::Signal(signal)),
                    None => Ok(n),
                };
            }
        }
    }
}

/// The run's scheduled purge of expired ids (`--purge-every`), between groups.
struct Purge {
    every: std::time::Duration,
    /// `None`: not yet in this run (the first purge comes at its start: a run
    /// from cron may be shorter than `every`).
    last: Option<Instant>,
}

impl Purge {
    fn every(every: std::time::Duration) -> Self {
        Purge { every, last: None }
    }

    /// Purges when `every` has passed since the last one. A failure is said
    /// and left for the next one: the run goes on (reads never see an
    /// expired id either way).
    fn if_due(&mut self, runtime: &mut Runtime) {
        if self.every.is_zero() || self.last.is_some_and(|at| at.elapsed() < self.every) {
            return;
        }
        self.last = Some(Instant::now());
        if let Err(e) = runtime.state().store.purge_expired() {
            bq_dedupe_host::say(&format!("bq-dedupe: purge of expired ids failed: {e}"));
        }
    }
}

/// Decides `lines`, `batch` per component call (the last call takes what is
/// left), and queues their verdicts for printing (printed and flushed after
/// the calls that decided and recorded them): as one group, or, once the
/// calls have taken [`PRINT_EVERY`], what is decided so far, so that a slow
/// stream read from a file shows its progress, not only each chunk's end.
fn decide_group(
    runtime: &mut Runtime,
    mut lines: impl ExactSizeIterator<Item = Line>,
    batch: usize,
    printer: &Printer,
) -> Result<(), Stop> {
    let mut verdicts = Vec::with_capacity(lines.len());
    let mut since = Instant::now();
    let mut unrecorded = false;
    // Once asked to stop, no more calls: what was decided is printed.
    while lines.len() > 0 && stopping::requested().is_none() && !unrecorded {
        let lines: Vec<Line> = lines.by_ref().take(batch).collect();
        if let Some(spans) = &mut runtime.state().spans {
            spans.start_batch(lines.iter().map(|(_, text)| text.as_deref().ok()));
        }
        let decided = decide(runtime, lines);
        if let Some(spans) = &mut runtime.state().spans {
            spans.end_batch(
                decided
                    .iter()
                    .map(|v| (v.kind, v.reason.as_deref(), v.duplicate, v.claimed)),
            );
        }
        // A store that reads but refuses writes (full, out of memory) would
        // have every later new id run unrecorded: 3,000 of 3,000 in a trial.
        unrecorded = decided
            .iter()
            .any(|v| v.kind == Some(OutcomeKind::RanUnrecorded));
        verdicts.extend(decided);
        if since.elapsed() >= PRINT_EVERY {
            printer.print(std::mem::take(&mut verdicts))?;
            since = Instant::now();
        }
    }
    printer.print(verdicts)?;
    match unrecorded {
        true => Err(Stop::Unrecorded {
            left: lines.len() > 0,
        }),
        false => Ok(()),
    }
}

/// A group's end: `Ok(false)` to go on, `Ok(true)` when the run has ended
/// there, else its stop. A group whose last call left a success unrecorded,
/// every line of it decided, `pending` none and none read after, ends the
/// run if the input has ended there (`ended`: its end already seen; else the
/// next event is waited for a moment, as a file's end follows its last
/// lines): every delivery was decided, and the run ends as a whole one (exit
/// 5), not stopped with lines said left (exit 3, where there were none: a
/// trial).
fn ended_there(
    group: Result<(), Stop>,
    pending: usize,
    events: &Receiver<Event>,
    ended: bool,
) -> Result<bool, Stop> {
    let decided = matches!(group, Err(Stop::Unrecorded { left: false })) && pending == 0;
    if !decided {
        return group.map(|()| false);
    }
    if ended {
        return Ok(true);
    }
    let until = Instant::now() + END_WAIT;
    loop {
        match events.recv_timeout(until.saturating_duration_since(Instant::now())) {
            Ok(Event::End) | Err(RecvTimeoutError::Disconnected) => return Ok(true),
            // Blank lines only (no verdict to give): read on (a review).
            Ok(Event::Lines(chunk)) if chunk.lines.is_empty() => {}
            _ => return group.map(|()| false),
        }
    }
}

/// How long [`ended_there`] waits for the input's end.
const END_WAIT: std::time::Duration = std::time::Duration::from_millis(200);

/// How long decided verdicts may wait for the rest of their group.
const PRINT_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// Lines per chunk, and bytes: with two chunks in flight, the reader holds at
/// most a few MiB ahead of the deciding loop.
const CHUNK_LINES: usize = 1024;
const CHUNK_BYTES: usize = 1 << 20;

/// The reader thread: numbered lines in chunks, each one line waited for and
/// then whatever is already buffered, up to `CHUNK_LINES` lines or
/// `CHUNK_BYTES` bytes; a read error last.
fn read_chunks(mut source: super::Lines, send: mpsc::SyncSender<Event>) {
    let blank = |line: &[u8]| line.iter().all(u8::is_ascii_whitespace);
    let mut n = 0u64;
    loop {
        let mut lines = Vec::with_capacity(CHUNK_LINES);
        let mut bytes = 0;
        // Some(Ok): the input ended; Some(Err): reading it failed.
        let mut stop: Option<std::io::Result<()>> = None;
        let first = n;
        while lines.len() < CHUNK_LINES && bytes < CHUNK_BYTES {
            match source.next() {
                Some(Ok(line)) => {
                    n += 1;
                    bytes += line.len();
                    // A cut line is judged by its whole, not by the blank
                    // start that was read of it.
                    if source.cut().is_some() || !blank(&line) {
                        let text = match source.cut() {
                            Some(size) => Err(super::reject_cut(size)),
                            None => String::from_utf8(line)
                                .map_err(|e| super::reject_bytes(e.as_bytes())),
                        };
                        lines.push((n, text));
                    }
                }
                Some(Err(e)) => {
                    stop = Some(Err(e));
                    break;
                }
                None => {
                    stop = Some(Ok(()));
                    break;
                }
            }
            if !source.buffered() {
                break;
            }
        }
        if n > first && send.send(Event::Lines(Chunk { last: n, lines })).is_err() {
            return;
        }
        match stop {
            None => {}
            // Said, not left to the channel closing: the printing thread
            // holds a sender too.
            Some(Ok(())) => {
                let _ = send.send(Event::End);
                return;
            }
            Some(Err(e)) => {
                let _ = send.send(Event::ReadFailed(e));
                return;
            }
        }
    }
}

/// Exit 0 when every delivery is done (acked), [`EXIT_RETRY`] when any needs a
/// redelivery (failed, parked, store unavailable, trapped), else [`EXIT_POISON`]
/// when any was rejected as poison, else [`EXIT_MAY_REPEAT`] when a success
/// may happen twice. Errors before or during the run exit 2.
fn exit_code(counts: &Counts) -> ExitCode {
    let any = |decision: &str| counts.get(decision).is_some_and(|&n| n > 0);
    if any("failed") || any("park") {
        ExitCode::from(EXIT_RETRY)
    } else if any("reject") {
        ExitCode::from(EXIT_POISON)
    } else if any("lease-lost") || any("unrecorded") {
        ExitCode::from(EXIT_MAY_REPEAT)
    } else {
        ExitCode::SUCCESS
    }
}

/// `bq-dedupe run` exit status: some deliveries need a retry.
pub const EXIT_RETRY: u8 = 3;
/// `bq-dedupe run` exit status: no retry needed, but some lines were poison.
pub const EXIT_POISON: u8 = 4;
/// `bq-dedupe run` exit status: every delivery done, but some success may
/// happen twice: `run-ok-lease-lost` (another consumer may have run it too) or
/// `run-ok-unrecorded` (a redelivery runs it again). Exit 0 hid both.
pub const EXIT_MAY_REPEAT: u8 = 5;

#[cfg(test)]
mod tests {
    use super::*;

    /// A run whose only trouble is a success that may happen twice exits 5,
    /// not 0 (`run-ok-unrecorded` and `run-ok-lease-lost` exited 0: a trial's
    /// finding); a retry or a poison line comes first.
    #[test]
    fn the_exit_status_says_a_success_may_repeat() {
        let status =
            |counts: &[(&'static str, u64)]| exit_code(&Counts::from_iter(counts.iter().copied()));
        assert_eq!(status(&[("run", 2), ("skip", 1)]), ExitCode::SUCCESS);
        for apart in ["unrecorded", "lease-lost"] {
            assert_eq!(
                status(&[("run", 2), (apart, 1)]),
                ExitCode::from(EXIT_MAY_REPEAT)
            );
            assert_eq!(
                status(&[("run", 2), (apart, 1), ("reject", 1)]),
                ExitCode::from(EXIT_POISON)
            );
            assert_eq!(
                status(&[("run", 2), (apart, 1), ("failed", 1)]),
                ExitCode::from(EXIT_RETRY)
            );
        }
    }
}
