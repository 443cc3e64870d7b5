//! `bq-dedupe run`: dedupe a stream of envelopes (JSON lines) through the
//! component, one JSON decision per line on stdout, a summary on stderr.

mod printer;

use std::collections::VecDeque;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bq_dedupe::{Limits, Message};
use bq_dedupe_stores::AnyStore;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use bq_dedupe_host::handler::{Handler, Plugin};
use bq_dedupe_host::runtime::{ComponentSource, Runtime, guard_options};
use bq_dedupe_host::wit::dedupe::babelqueue::idempotency::types::{Outcome, Processed};

use printer::{Counts, Printer, Stopped};

#[derive(Args)]
pub struct RunArgs {
    /// memory | sqlite:PATH | redis://HOST:PORT[/DB][?dialect=D&prefix=P] |
    /// redis+cluster://HOST:PORT[,HOST:PORT...] | postgres://USER@HOST:PORT/DB[?table=T]
    #[arg(long, default_value = bq_dedupe_host::DEFAULT_STORE)]
    store: String,
    /// Remember ids for this long (e.g. 90s, 15m, 24h, 7d; default: forever).
    #[arg(long, value_parser = parse_duration)]
    ttl: Option<Duration>,
    /// Claiming mode: take an in-flight claim before running, park concurrent duplicates.
    #[arg(long)]
    claim: bool,
    /// How long a claim lasts if its holder dies.
    #[arg(long, value_parser = parse_duration, default_value = "15m")]
    lease: Duration,
    /// Store key prefix (namespace).
    #[arg(long, default_value = "")]
    prefix: String,
    /// Payload fingerprints: an id already processed with another `data` is
    /// rejected as `payload-mismatch` (poison) instead of skipped. Needs a store
    /// of our own record format (not a PHP/Go dialect or the Go SDK's table).
    #[arg(long)]
    fingerprint: bool,
    /// A shell command run per message with the envelope on stdin (exit 0 = success).
    #[arg(long, conflicts_with = "handler")]
    exec: Option<String>,
    /// A handler plugin component exporting the WIT `handler` interface.
    #[arg(long)]
    handler: Option<PathBuf>,
    /// Deliveries per component call (process-batch): one store round trip to
    /// decide and one to record per batch, duplicates inside a batch collapsed.
    /// A batch is cut early when `--window` has passed since its first line.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=1000))]
    batch: u32,
    /// The longest a line waits for its batch to fill (e.g. 5ms, 1s): a slow
    /// stream still gets each verdict within about this much of its line.
    #[arg(long, value_parser = parse_duration, default_value = "5ms")]
    window: Duration,
    /// Input file, or - for stdin.
    #[arg(default_value = "-")]
    input: String,
}

/// `90s`, `15m`, `24h`, `7d`, `250ms`, or a number of seconds.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().map_err(|_| format!("invalid duration {s:?}"))?;
    let ms = match unit {
        "ms" => n,
        "" | "s" => n * 1000,
        "m" => n * 60_000,
        "h" => n * 3_600_000,
        "d" => n * 86_400_000,
        _ => return Err(format!("invalid duration unit in {s:?} (ms, s, m, h, d)")),
    };
    Ok(Duration::from_millis(ms))
}

/// The issue's decision vocabulary for an outcome, and why (if anything is notable).
fn describe(outcome: &Outcome) -> (&'static str, &'static str, Option<String>) {
    match outcome {
        Outcome::RunOk => ("run", "run-ok", None),
        Outcome::RunOkUnrecorded(e) => (
            "run",
            "run-ok-unrecorded",
            Some(format!("ran, but not recorded: {}", e.message)),
        ),
        Outcome::RunOkLeaseLost => (
            "run",
            "run-ok-lease-lost",
            Some("ran, but its claim was lost first: the id may have run elsewhere too".into()),
        ),
        Outcome::RunFailed(m) => ("failed", "run-failed", Some(m.clone())),
        Outcome::RunPanicked(m) => ("failed", "run-panicked", Some(m.clone())),
        Outcome::Skip => ("skip", "skip", None),
        Outcome::FailOpen => ("fail-open", "fail-open", None),
        Outcome::FailOpenFailed(m) => ("failed", "fail-open-failed", Some(m.clone())),
        Outcome::Park => (
            "park",
            "park",
            Some("another consumer holds the claim; redeliver later".into()),
        ),
        Outcome::Rejected(r) => ("reject", "rejected", Some(r.message.clone())),
        Outcome::PayloadMismatch => (
            "reject",
            "payload-mismatch",
            Some("already processed with a different payload".into()),
        ),
        Outcome::StoreUnavailable(e) => (
            "failed",
            "store-unavailable",
            Some(format!("store unavailable: {}", e.message)),
        ),
    }
}

/// One printed verdict: (line, decision, outcome code, reason, meta.id).
type Verdict = (
    u64,
    &'static str,
    &'static str,
    Option<String>,
    Option<String>,
);

/// Puts a batch of lines through the run's guard (`consumer.guard`'s
/// `process-batch-ids`, which decodes each line once and hands its `meta.id`
/// back): one verdict per line, in order. A line that is not UTF-8 cannot cross
/// and is rejected here.
fn decide(runtime: &mut Runtime, batch: Vec<Line>) -> Vec<Verdict> {
    let mut verdicts: Vec<Option<Verdict>> = Vec::with_capacity(batch.len());
    let mut texts: Vec<String> = Vec::with_capacity(batch.len());
    let mut lines: Vec<u64> = Vec::with_capacity(batch.len());
    for (line, text) in batch {
        match text {
            Err(bytes) => {
                let reason = super::reject_bytes(&bytes).to_string();
                verdicts.push(Some((line, "reject", "rejected", Some(reason), None)));
            }
            Ok(text) => {
                lines.push(line);
                texts.push(text);
                verdicts.push(None);
            }
        }
    }
    let processed = match texts.as_slice() {
        [] => Ok(Vec::new()),
        many => runtime.guard_process_batch_ids(many),
    };
    let decided = resolve(&lines, &texts, processed);
    // Every `None` slot is a text, and `decided` holds one verdict per text.
    let mut decided = decided.into_iter();
    verdicts
        .into_iter()
        .filter_map(|v| v.or_else(|| decided.next()))
        .collect()
}

/// The verdicts of one component call, one per text. A call that trapped (the
/// instance has been replaced) or answered the wrong number of deliveries leaves
/// every one of its deliveries unacked: `failed`, outcome `trap`, so it is
/// retried, never lost; only then are the ids read natively, for the report.
fn resolve(lines: &[u64], texts: &[String], processed: Result<Vec<Processed>>) -> Vec<Verdict> {
    let processed = processed.and_then(|p| {
        if p.len() == texts.len() {
            Ok(p)
        } else {
            Err(anyhow::anyhow!(
                "the component answered {} of {} deliveries",
                p.len(),
                texts.len()
            ))
        }
    });
    match processed {
        Ok(processed) => lines
            .iter()
            .zip(processed)
            .map(|(&line, Processed { id, outcome })| {
                let (decision, code, reason) = describe(&outcome);
                (line, decision, code, reason, id)
            })
            .collect(),
        Err(e) => {
            let reason = format!("{e:#}");
            lines
                .iter()
                .zip(texts)
                .map(|(&line, text)| {
                    let id = Message::parse_str(text, &Limits::default())
                        .ok()
                        .and_then(|m| m.id().map(str::to_owned));
                    (line, "failed", "trap", Some(reason.clone()), id)
                })
                .collect()
        }
    }
}

/// What wakes the deciding loop: the reader thread's lines and end, or the
/// printing thread stopping (stdout closed), which must end a run that may be
/// waiting for input.
enum Event {
    /// Lines read, in input order.
    Lines(Chunk),
    ReadFailed(std::io::Error),
    End,
    PrinterStopped,
}

/// Lines as the reader thread hands them over: blank lines dropped, the rest
/// numbered and checked for UTF-8 (a line that is not stays bytes, to be
/// rejected in its turn), so the deciding thread does neither.
struct Chunk {
    /// The number of the chunk's last line, blank or not.
    last: u64,
    lines: Vec<Line>,
}

/// A numbered line: its text, or the bytes of a line that is not UTF-8.
type Line = (u64, Result<String, Vec<u8>>);

/// Why the deciding loop stopped before the end of its input.
enum Stop {
    Read(std::io::Error),
    /// The printing thread stopped first; `Printer::finish` says why.
    Printer,
}

impl From<Stopped> for Stop {
    fn from(_: Stopped) -> Self {
        Stop::Printer
    }
}

pub fn run(component: &ComponentSource, args: RunArgs) -> Result<ExitCode> {
    let handler = match (&args.exec, &args.handler) {
        (Some(cmd), _) => Handler::Exec(cmd.clone()),
        (None, Some(path)) => Handler::Plugin(Box::new(Plugin::load(path)?)),
        (None, None) => Handler::Mark,
    };
    let store = AnyStore::from_spec(&args.store)
        .with_context(|| format!("opening store {}", bq_dedupe_host::shown_spec(&args.store)))?;
    if args.claim && !bq_dedupe::Store::capabilities(&store).claim {
        bail!(
            "store {} cannot claim",
            bq_dedupe_host::shown_spec(&args.store)
        );
    }
    if let Some(format) = bq_dedupe::Store::shared_format(&store).filter(|_| args.fingerprint) {
        bail!(
            "--fingerprint needs our own record format; store {} keeps {format} records",
            bq_dedupe_host::shown_spec(&args.store)
        );
    }
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
    let source = super::Lines::open(&args.input)?;
    let printer = Printer::spawn(send.clone());
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
    };
    let counts = counts?;
    progress.finish_and_clear();
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "summary: {} lines in {secs:.2}s ({:.0}/s) {}",
        n,
        n as f64 / secs.max(1e-9),
        serde_json::to_string(&counts)?
    );
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
    let batch = args.batch as usize;
    let mut n = 0u64;
    // Lines read and not yet decided, oldest first; `deadline` is when the oldest
    // of them has waited `--window`.
    let mut pending: VecDeque<Line> = VecDeque::with_capacity(2 * batch);
    let mut deadline: Option<Instant> = None;
    loop {
        // Every full batch is decided now; a remainder waits for more lines, for
        // its window, or for the end of input.
        if pending.len() >= batch {
            let full = pending.len() / batch * batch;
            decide_group(runtime, pending.drain(..full), batch, printer)?;
            deadline = (!pending.is_empty()).then(|| Instant::now() + args.window);
        }
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
            Err(RecvTimeoutError::Timeout) => {
                decide_group(runtime, pending.drain(..), batch, printer)?;
                deadline = None;
            }
            Ok(Event::End) | Err(RecvTimeoutError::Disconnected) => {
                decide_group(runtime, pending.drain(..), batch, printer)?;
                return Ok(n);
            }
        }
    }
}

/// Decides `lines`, `batch` per component call (the last call takes what is
/// left), and queues their verdicts as one group (printed and flushed together,
/// after the calls that decided and recorded them).
fn decide_group(
    runtime: &mut Runtime,
    mut lines: impl ExactSizeIterator<Item = Line>,
    batch: usize,
    printer: &Printer,
) -> Result<(), Stopped> {
    let mut verdicts = Vec::with_capacity(lines.len());
    while lines.len() > 0 {
        verdicts.extend(decide(runtime, lines.by_ref().take(batch).collect()));
    }
    printer.print(verdicts)
}

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
                    if !blank(&line) {
                        lines.push((n, String::from_utf8(line).map_err(|e| e.into_bytes())));
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
/// when any was rejected as poison. Errors before or during the run exit 2.
fn exit_code(counts: &Counts) -> ExitCode {
    let any = |decision: &str| counts.get(decision).is_some_and(|&n| n > 0);
    if any("failed") || any("park") {
        ExitCode::from(EXIT_RETRY)
    } else if any("reject") {
        ExitCode::from(EXIT_POISON)
    } else {
        ExitCode::SUCCESS
    }
}

/// `bq-dedupe run` exit status: some deliveries need a retry.
pub const EXIT_RETRY: u8 = 3;
/// `bq-dedupe run` exit status: no retry needed, but some lines were poison.
pub const EXIT_POISON: u8 = 4;

#[cfg(test)]
mod tests {
    use super::{parse_duration, resolve};
    use std::time::Duration;

    /// A call that trapped: every delivery of it is reported, in order, as failed
    /// with outcome `trap` (retried, exit 3), with its id read natively.
    #[test]
    fn a_trapped_call_reports_each_of_its_deliveries_as_failed() {
        let texts = vec![
            r#"{"job":"j","trace_id":"t","data":{},"meta":{"id":"a","schema_version":1}}"#
                .to_string(),
            "garbage".to_string(),
        ];
        let verdicts = resolve(
            &[3, 5],
            &texts,
            Err(anyhow::anyhow!("wasm trap: unreachable")),
        );
        assert_eq!(verdicts.len(), 2);
        assert_eq!(verdicts[0].0, 3);
        assert_eq!((verdicts[0].1, verdicts[0].2), ("failed", "trap"));
        assert_eq!(verdicts[0].4.as_deref(), Some("a"));
        assert!(verdicts[0].3.as_deref().unwrap().contains("unreachable"));
        assert_eq!(
            (verdicts[1].0, verdicts[1].1, verdicts[1].4.clone()),
            (5, "failed", None)
        );
        // A short answer is treated the same way: nothing is left unreported.
        let short = resolve(&[1, 2], &texts, Ok(Vec::new()));
        assert!(short.iter().all(|v| v.1 == "failed" && v.2 == "trap"));
        assert_eq!(short.len(), 2);
    }

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(604_800)));
        assert!(parse_duration("5 weeks").is_err());
        assert!(parse_duration("m").is_err());
    }
}
