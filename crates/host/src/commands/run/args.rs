//! `bq-dedupe run`'s arguments.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

#[derive(Args)]
pub struct RunArgs {
    // The stores' table lists the forms (one place for a new store).
    // Its value from the environment is never shown (`--help` included).
    #[arg(
        long,
        env = bq_dedupe_host::STORE_ENV,
        hide_env_values = true,
        default_value = bq_dedupe_host::DEFAULT_STORE,
        help = bq_dedupe_stores::Backend::forms()
    )]
    pub(super) store: String,
    /// Remember ids for this long (e.g. 90s, 15m, 24h, 7d; default: forever).
    #[arg(long, value_parser = parse_positive_duration)]
    pub(super) ttl: Option<Duration>,
    /// Claiming mode: take an in-flight claim before running, park concurrent duplicates.
    #[arg(long)]
    pub(super) claim: bool,
    /// How long a claim lasts if its holder dies (with `--claim` only).
    #[arg(long, requires = "claim", value_parser = parse_positive_duration, default_value = "15m")]
    pub(super) lease: Duration,
    /// Store key prefix: text put before each id. In one store, no consumer's
    /// prefix may begin another's (an empty one begins every one): `orders:` + `1`
    /// and `` + `orders:1` are one key (docs/rules.md).
    #[arg(long, default_value = "")]
    pub(super) prefix: String,
    /// Payload fingerprints: an id already processed with another `data` is
    /// rejected as `payload-mismatch` (poison) instead of skipped. Needs a store
    /// of our own record format (not a PHP/Go dialect or the Go SDK's table).
    #[arg(long)]
    pub(super) fingerprint: bool,
    /// A shell command run per message with the envelope on stdin (exit 0 = success).
    #[arg(long, conflicts_with = "handler", value_parser = parse_command)]
    pub(super) exec: Option<String>,
    /// The longest one handler may run (e.g. 30s, 5m): then an `--exec` one is
    /// killed with every process it started, a `--handler` plugin's call is
    /// stopped (its instance replaced), and the delivery fails (retried; in
    /// claiming mode its claim released, renewed no longer).
    #[arg(long, value_parser = parse_positive_duration, default_value = "5m")]
    pub(super) handler_timeout: Duration,
    /// Pass an `--exec` handler's stdout and stderr on to this command's
    /// stderr (its stdout is the verdicts). Without it neither is shown; the
    /// end of stderr is a failure's reason either way.
    #[arg(long, requires = "exec")]
    pub(super) show_handler_output: bool,
    /// A handler plugin component exporting the WIT `handler` interface.
    #[arg(long)]
    pub(super) handler: Option<PathBuf>,
    /// Deliveries per component call (process-batch): one store round trip to
    /// decide and one to record per batch, duplicates inside a batch collapsed.
    /// A batch is cut early when `--window` has passed since its first line.
    /// Default 100; with `--exec`, 1: each success is recorded before the next
    /// handler starts (a `kill -9` during a slow handler re-runs only that
    /// delivery) and no claim is taken for a line whose handler has not started.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
    batch: Option<u32>,
    /// The longest a line waits for its batch to fill (e.g. 5ms, 1s): a slow
    /// stream still gets each verdict within about this much of its line.
    #[arg(long, value_parser = parse_duration, default_value = "5ms")]
    pub(super) window: Duration,
    /// How often a run deletes expired ids from its store (as `bq-dedupe
    /// purge`; live claims stay): at its start, then every this long; 0 never.
    #[arg(long, value_parser = parse_duration, default_value = "10m")]
    pub(super) purge_every: Duration,
    /// Export spans and metrics over OTLP/HTTP to this collector (a base URL,
    /// as `OTEL_EXPORTER_OTLP_ENDPOINT`, which it overrides; docs/observability.md).
    #[arg(long, value_name = "URL")]
    pub(super) otlp_endpoint: Option<String>,
    /// Input file, or - for stdin.
    #[arg(default_value = "-")]
    pub(super) input: String,
}

impl RunArgs {
    /// `--batch`, or its default: 1 for an `--exec` handler (a process per
    /// delivery, next to which a store round trip is small), else 100.
    pub(super) fn batch(&self) -> u32 {
        self.batch
            .unwrap_or(if self.exec.is_some() { 1 } else { 100 })
    }
}

/// The longest duration a flag takes: 100 years.
const MAX_DURATION_MS: u64 = 36_500 * 86_400_000;

/// [`parse_duration`], and more than zero (a TTL of 0 would forget every id
/// at once, a lease of 0 let every duplicate run beside the first, a handler
/// timeout of 0 fail every delivery).
pub(super) fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    match parse_duration(s)? {
        d if d.is_zero() => Err(format!("{s:?}: must be more than zero")),
        d => Ok(d),
    }
}

/// A command with something to run: `sh -c ""` succeeds at once, so an empty
/// `--exec "$UNSET"` recorded every id as done and ran nothing.
fn parse_command(s: &str) -> Result<String, String> {
    match s.trim() {
        "" => Err(
            "an empty command would run nothing and record every id as done \
                   (for that on purpose, leave out --exec: a mark run)"
                .into(),
        ),
        _ => Ok(s.to_string()),
    }
}

/// `90s`, `15m`, `24h`, `7d`, `250ms`, or a number of seconds.
pub(super) fn parse_duration(s: &str) -> Result<Duration, String> {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().map_err(|_| format!("invalid duration {s:?}"))?;
    let scale: u64 = match unit {
        "ms" => 1,
        "" | "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(format!("invalid duration unit in {s:?} (ms, s, m, h, d)")),
    };
    // Checked: an overflow must not wrap to a short window.
    match n.checked_mul(scale).filter(|&ms| ms <= MAX_DURATION_MS) {
        Some(ms) => Ok(Duration::from_millis(ms)),
        None => Err(format!("duration {s:?} is too long (at most 36500d)")),
    }
}

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
        // An overflow is an argument error, never a wrapped short window
        // (18446744073709552 s x 1000 wrapped to 384 ms).
        assert!(parse_duration("18446744073709552s").is_err());
        assert!(parse_duration("36501d").is_err());
        assert_eq!(
            parse_duration("36500d"),
            Ok(Duration::from_secs(36_500 * 86_400))
        );
    }
}
