//! Each line's verdict: what the component's outcome means for it, in the
//! words `bq-dedupe run` prints.

use anyhow::Result;
use bq_dedupe::telemetry::Fields;
use bq_dedupe::{Message, OutcomeKind, envelope::Limits};

use bq_dedupe_host::runtime::Runtime;
use bq_dedupe_host::wit::dedupe::babelqueue::idempotency::types::{DeliveryReport, Outcome};

use super::Line;

/// A kind whose reason is the core's own wording ([`OutcomeKind::reason`]).
fn fixed(kind: OutcomeKind) -> (OutcomeKind, Option<String>) {
    (kind, kind.reason().map(str::to_string))
}

/// The core's kind of a component outcome, and why (where anything is notable).
fn kind_of(outcome: &Outcome) -> (OutcomeKind, Option<String>) {
    match outcome {
        Outcome::RunOk => (OutcomeKind::Ran, None),
        Outcome::RunOkUnrecorded(e) => (
            OutcomeKind::RanUnrecorded,
            Some(format!("ran, but not recorded: {}", e.message)),
        ),
        Outcome::RunOkLeaseLost => fixed(OutcomeKind::RanLeaseLost),
        Outcome::RunFailed(m) => (OutcomeKind::Failed, Some(m.clone())),
        Outcome::RunPanicked(m) => (OutcomeKind::Panicked, Some(m.clone())),
        Outcome::Skip => (OutcomeKind::Skipped, None),
        Outcome::FailOpen => fixed(OutcomeKind::FailOpen),
        Outcome::FailOpenFailed(m) => (OutcomeKind::FailOpenFailed, Some(m.clone())),
        Outcome::Park => fixed(OutcomeKind::Parked),
        Outcome::Rejected(r) => (OutcomeKind::Rejected, Some(r.message.clone())),
        Outcome::PayloadMismatch => fixed(OutcomeKind::PayloadMismatch),
        Outcome::StoreUnavailable(e) => (
            OutcomeKind::StoreUnavailable,
            Some(format!("store unavailable: {}", e.message)),
        ),
    }
}

/// The decision a line's verdict prints for an outcome kind.
fn decision(kind: OutcomeKind) -> &'static str {
    match kind {
        OutcomeKind::Ran | OutcomeKind::RanUnrecorded | OutcomeKind::RanLeaseLost => "run",
        OutcomeKind::Skipped => "skip",
        OutcomeKind::FailOpen => "fail-open",
        OutcomeKind::Parked => "park",
        OutcomeKind::Rejected | OutcomeKind::PayloadMismatch => "reject",
        OutcomeKind::Failed
        | OutcomeKind::Panicked
        | OutcomeKind::FailOpenFailed
        | OutcomeKind::StoreUnavailable => "failed",
    }
}

/// One printed verdict: what became of one input line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct LineVerdict {
    /// The line's number in the input (from 1, blank lines counted).
    pub(super) line: u64,
    /// `run`, `skip`, `fail-open`, `park`, `reject` or `failed`.
    pub(super) decision: &'static str,
    /// The outcome code (`run-ok`, `skip`, ..., or `trap`).
    pub(super) outcome: &'static str,
    /// Why, where anything is notable.
    pub(super) reason: Option<String>,
    /// The line's `meta.id`, when it has one.
    pub(super) id: Option<String>,
    /// The outcome's kind (`None`: its call trapped), for its span.
    pub(super) kind: Option<OutcomeKind>,
    /// For its span, as the component reported them: its handler did not run
    /// because its id was done or an earlier line of its batch had it; it held
    /// a claim.
    pub(super) duplicate: bool,
    pub(super) claimed: bool,
    /// Its call trapped after its handler had succeeded: its success may be
    /// unrecorded (the summary counts it `unrecorded`).
    pub(super) ran_before_trap: bool,
}

impl LineVerdict {
    /// The verdict of a line the component decided.
    fn of(line: u64, report: DeliveryReport) -> Self {
        let (kind, reason) = kind_of(&report.outcome);
        LineVerdict {
            line,
            decision: decision(kind),
            outcome: kind.code(),
            reason,
            id: report.id,
            kind: Some(kind),
            duplicate: report.duplicate,
            claimed: report.claimed,
            ran_before_trap: false,
        }
    }

    /// A line whose call trapped (or answered short): retried, never lost.
    fn trapped(line: u64, reason: String, id: Option<String>, ran: bool) -> Self {
        LineVerdict {
            line,
            decision: "failed",
            outcome: bq_dedupe::telemetry::TRAPPED,
            reason: Some(reason),
            id,
            kind: None,
            duplicate: false,
            claimed: false,
            ran_before_trap: ran,
        }
    }
}

/// Puts a batch of lines through the run's guard (`consumer.guard`'s
/// `process-batch-reports`, which decodes each line once and hands its
/// `meta.id` back, with what its span reports): one verdict per line, in order.
/// A line that cannot cross (not UTF-8, or cut at the size limit) is rejected
/// here, with the rejection the reader made.
pub(super) fn decide(runtime: &mut Runtime, batch: Vec<Line>) -> Vec<LineVerdict> {
    let mut verdicts: Vec<Option<LineVerdict>> = Vec::with_capacity(batch.len());
    let mut texts: Vec<String> = Vec::with_capacity(batch.len());
    let mut lines: Vec<u64> = Vec::with_capacity(batch.len());
    for (line, text) in batch {
        match text {
            Err(rejection) => {
                let reason = rejection.to_string();
                verdicts.push(Some(LineVerdict {
                    line,
                    decision: "reject",
                    outcome: "rejected",
                    reason: Some(reason),
                    id: None,
                    kind: Some(OutcomeKind::Rejected),
                    duplicate: false,
                    claimed: false,
                    ran_before_trap: false,
                }));
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
        many => runtime.guard_process_batch_reports(many),
    };
    let ran: Vec<bool> = match &processed {
        Ok(_) => Vec::new(),
        Err(_) => texts.iter().map(|t| runtime.ran_before_trap(t)).collect(),
    };
    let mut decided = resolve(&lines, &texts, processed, &ran);
    rerun_after_failed_leaders(runtime, &lines, texts, &mut decided);
    // Every `None` slot is a text, and `decided` holds one verdict per text.
    let mut decided = decided.into_iter();
    verdicts
        .into_iter()
        .filter_map(|v| v.or_else(|| decided.next()))
        .collect()
}

/// Gives a batch the verdicts of one-at-a-time processing. The guard collapses
/// an id's deliveries inside one batch onto the first; when that one failed,
/// the others come back `park`, where one at a time each would have run again
/// (the failure left the id free). Those are decided again, in their order, in
/// a call of their own (and again, while a first one still fails).
fn rerun_after_failed_leaders(
    runtime: &mut Runtime,
    lines: &[u64],
    texts: Vec<String>,
    decided: &mut [LineVerdict],
) {
    let mut failed: std::collections::HashSet<&str> = std::collections::HashSet::new();
    let mut again: Vec<usize> = Vec::new();
    for (i, verdict) in decided.iter().enumerate() {
        let Some(id) = verdict.id.as_deref() else {
            continue;
        };
        // (A copy with another payload behind a failed first delivery parks
        // too: the guard judges it only once the first is recorded.)
        if verdict.decision == "park" && failed.contains(id) {
            again.push(i);
        } else if verdict.decision == "failed" {
            failed.insert(id);
        }
    }
    if again.is_empty() {
        return;
    }
    let mut texts: Vec<Option<String>> = texts.into_iter().map(Some).collect();
    let batch: Vec<Line> = again
        .iter()
        .map(|&i| (lines[i], Ok(texts[i].take().unwrap_or_default())))
        .collect();
    for (i, verdict) in again.into_iter().zip(decide(runtime, batch)) {
        decided[i] = verdict;
    }
}

/// The verdicts of one component call, one per text. A call that trapped (the
/// instance has been replaced) or answered the wrong number of deliveries leaves
/// every one of its deliveries unacked: `failed`, outcome `trap`, so it is
/// retried, never lost; only then are the ids read natively, for the report.
/// `ran[i]`: text `i`'s handler had succeeded before the call trapped (its
/// success perhaps unrecorded), which its reason says.
fn resolve(
    lines: &[u64],
    texts: &[String],
    processed: Result<Vec<DeliveryReport>>,
    ran: &[bool],
) -> Vec<LineVerdict> {
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
            .zip(texts)
            .zip(processed)
            .map(|((&line, text), mut report)| {
                // A rejected line's id where it can be read (a line to find in
                // the queue), as `check` gives it: the guard gives none.
                if report.id.is_none() && matches!(report.outcome, Outcome::Rejected(_)) {
                    let id = Fields::lenient(text.as_bytes()).id;
                    report.id = (!id.is_empty()).then(|| id.into_owned());
                }
                LineVerdict::of(line, report)
            })
            .collect(),
        Err(e) => {
            let reason = format!("{e:#}");
            lines
                .iter()
                .zip(texts)
                .enumerate()
                .map(|(i, (&line, text))| {
                    let id = Message::parse_str(text, &Limits::default())
                        .ok()
                        .and_then(|m| m.id().map(str::to_owned));
                    let reason = match ran.get(i) {
                        Some(true) => format!(
                            "{reason}; its handler had run and succeeded before that, and its \
                             success may not be recorded: the retry may run it again"
                        ),
                        _ => reason.clone(),
                    };
                    LineVerdict::trapped(line, reason, id, ran.get(i) == Some(&true))
                })
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::resolve;

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
            &[true, false],
        );
        assert_eq!(verdicts.len(), 2);
        assert_eq!(verdicts[0].line, 3);
        assert_eq!(
            (verdicts[0].decision, verdicts[0].outcome),
            ("failed", "trap")
        );
        assert_eq!(verdicts[0].id.as_deref(), Some("a"));
        assert!(
            verdicts[0]
                .reason
                .as_deref()
                .unwrap()
                .contains("unreachable")
        );
        // Its handler had succeeded before the trap: the retry may run it again.
        assert!(
            verdicts[0]
                .reason
                .as_deref()
                .unwrap()
                .contains("the retry may run it again")
        );
        assert!(!verdicts[1].reason.as_deref().unwrap().contains("retry may"));
        assert_eq!(
            (
                verdicts[1].line,
                verdicts[1].decision,
                verdicts[1].id.clone()
            ),
            (5, "failed", None)
        );
        // A short answer is treated the same way: nothing is left unreported.
        let short = resolve(&[1, 2], &texts, Ok(Vec::new()), &[]);
        assert!(
            short
                .iter()
                .all(|v| v.decision == "failed" && v.outcome == "trap")
        );
        assert_eq!(short.len(), 2);
    }
}
