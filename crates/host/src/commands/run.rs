//! `bq-dedupe run`: dedupe a stream of envelopes (JSON lines) through the
//! component, one JSON decision per line on stdout, a summary on stderr.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bq_dedupe::{Limits, Message};
use bq_dedupe_stores::AnyStore;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use bq_dedupe_host::handler::{Handler, Plugin};
use bq_dedupe_host::runtime::{ComponentSource, Runtime, options};
use bq_dedupe_host::wit::dedupe::babelqueue::idempotency::types::{Options, Outcome};

#[derive(Args)]
pub struct RunArgs {
    /// memory | sqlite:PATH | redis://HOST:PORT[/DB][?prefix=P]
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
    /// A shell command run per message with the envelope on stdin (exit 0 = success).
    #[arg(long, conflicts_with = "handler")]
    exec: Option<String>,
    /// A handler plugin component exporting the WIT `handler` interface.
    #[arg(long)]
    handler: Option<PathBuf>,
    /// Deliveries per component call (process-batch): one store round trip to
    /// decide and one to record per batch, duplicates inside a batch collapsed.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
    batch: u32,
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

/// The decision vocabulary for an outcome, and why (if anything is notable).
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
        Outcome::StoreUnavailable(e) => (
            "failed",
            "store-unavailable",
            Some(format!("store unavailable: {}", e.message)),
        ),
    }
}

type Verdict = (
    u64,
    &'static str,
    &'static str,
    Option<String>,
    Option<String>,
);

/// Puts a batch of lines through the component: (line, decision, outcome code,
/// reason, meta.id) for each.
fn decide(runtime: &mut Runtime, opts: &Options, batch: Vec<(u64, Vec<u8>)>) -> Vec<Verdict> {
    let mut verdicts: Vec<Option<Verdict>> = Vec::with_capacity(batch.len());
    let mut texts: Vec<String> = Vec::new();
    let mut ids: Vec<(u64, Option<String>)> = Vec::new();
    for (line, bytes) in batch {
        match String::from_utf8(bytes) {
            Err(e) => {
                let reason = super::reject_bytes(e.as_bytes()).to_string();
                verdicts.push(Some((line, "reject", "rejected", Some(reason), None)));
            }
            Ok(text) => {
                let id = Message::parse_str(&text, &Limits::default())
                    .ok()
                    .and_then(|m| m.id().map(str::to_owned));
                ids.push((line, id));
                texts.push(text);
                verdicts.push(None);
            }
        }
    }
    let outcomes = match texts.as_slice() {
        [] => Ok(Vec::new()),
        [one] => runtime.process(one, opts).map(|o| vec![o]),
        many => runtime.process_batch(many, opts),
    }
    .and_then(|outcomes| {
        if outcomes.len() == texts.len() {
            Ok(outcomes)
        } else {
            Err(anyhow::anyhow!(
                "the component answered {} of {} deliveries",
                outcomes.len(),
                texts.len()
            ))
        }
    });
    let mut decided = ids
        .into_iter()
        .enumerate()
        .map(|(i, (line, id))| match &outcomes {
            Ok(outcomes) => {
                let (decision, code, reason) = describe(&outcomes[i]);
                (line, decision, code, reason, id)
            }
            // The instance was replaced; these messages are not acked.
            Err(e) => (line, "failed", "trap", Some(format!("{e:#}")), id),
        });
    // Every `None` slot is a text, and `decided` yields one verdict per text.
    verdicts
        .into_iter()
        .filter_map(|v| v.or_else(|| decided.next()))
        .collect()
}

pub fn run(component: &ComponentSource, args: RunArgs) -> Result<ExitCode> {
    let handler = match (&args.exec, &args.handler) {
        (Some(cmd), _) => Handler::Exec(cmd.clone()),
        (None, Some(path)) => Handler::Plugin(Box::new(Plugin::load(path)?)),
        (None, None) => Handler::Mark,
    };
    let store = AnyStore::from_spec(&args.store)
        .with_context(|| format!("opening store {}", args.store))?;
    if args.claim && !bq_dedupe::Store::capabilities(&store).claim {
        bail!("store {} cannot claim", args.store);
    }
    let mut runtime = Runtime::load(component, store, handler)?;
    let mut opts = options(&args.prefix);
    opts.ttl_ms = args.ttl.map(|d| d.as_millis() as u64);
    opts.claim_lease_ms = args.claim.then_some(args.lease.as_millis() as u64);

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
    let mut counts: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut stdout = std::io::stdout().lock();
    let mut n = 0u64;
    let mut pending: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut lines = super::lines(&args.input)?.peekable();
    while let Some(line) = lines.next() {
        n += 1;
        let line = line?;
        if !line.iter().all(u8::is_ascii_whitespace) {
            pending.push((n, line));
        }
        if pending.len() < args.batch as usize && lines.peek().is_some() {
            continue;
        }
        for (line, decision, code, reason, id) in
            decide(&mut runtime, &opts, std::mem::take(&mut pending))
        {
            *counts.entry(decision).or_default() += 1;
            // One line per delivery, flushed at once: what is printed has happened.
            let record = json!({"line": line, "id": id, "decision": decision, "outcome": code, "reason": reason});
            writeln!(stdout, "{record}")?;
        }
        stdout.flush()?;
        progress.set_position(n);
    }
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

/// Exit 0 when every delivery is done (acked), [`EXIT_RETRY`] when any needs a
/// redelivery (failed, parked, store unavailable, trapped), else [`EXIT_POISON`]
/// when any was rejected as poison. Errors before or during the run exit 2.
fn exit_code(counts: &BTreeMap<&'static str, u64>) -> ExitCode {
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
    use super::parse_duration;
    use std::time::Duration;

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
