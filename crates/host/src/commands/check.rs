//! `bq-dedupe check`: validate envelopes, one verdict per line.

use std::process::ExitCode;

use anyhow::Result;
use bq_dedupe::{Message, OutcomeKind, envelope::Limits, telemetry::Fields};
use bq_dedupe_stores::AnyStore;
use serde_json::json;

use bq_dedupe_host::handler::Handler;
use bq_dedupe_host::runtime::{ComponentSource, Runtime};
use bq_dedupe_host::wit::dedupe::babelqueue::idempotency::types::RejectionCode;

/// The WIT rejection code in its kebab spelling (the core's `Rejection::code`).
fn code(code: RejectionCode) -> &'static str {
    match code {
        RejectionCode::NotJson => "not-json",
        RejectionCode::NotAnObject => "not-an-object",
        RejectionCode::TooLarge => "too-large",
        RejectionCode::TooDeep => "too-deep",
        RejectionCode::MissingJob => "missing-job",
        RejectionCode::MetaNotObject => "meta-not-object",
        RejectionCode::UnsupportedSchemaVersion => "unsupported-schema-version",
        RejectionCode::DataNotObject => "data-not-object",
        RejectionCode::BlankTraceId => "blank-trace-id",
        RejectionCode::BadAttempts => "bad-attempts",
    }
}

pub fn run(component: &ComponentSource, input: &str) -> Result<ExitCode> {
    // Validation never touches the store; an in-memory one satisfies the import.
    let mut runtime = Runtime::load(component, AnyStore::from_spec("memory")?, Handler::Mark)?;
    let mut invalid = 0u64;
    let mut lines = super::Lines::open(input)?;
    let mut n = 0;
    while let Some(line) = lines.next() {
        let line = line?;
        n += 1;
        let verdict = match (lines.cut(), std::str::from_utf8(&line)) {
            (Some(size), _) => {
                let r = super::reject_cut(size);
                Err((r.code().to_string(), r.to_string()))
            }
            (None, Err(_)) => {
                let r = super::reject_bytes(&line);
                Err((r.code().to_string(), r.to_string()))
            }
            (None, Ok(text)) => match runtime.decode(text)? {
                Ok(_) => Ok(Message::parse_str(text, &Limits::default())
                    .ok()
                    .and_then(|m| m.id().map(str::to_owned))),
                Err(r) => Err((code(r.code).to_string(), r.message)),
            },
        };
        let record = match verdict {
            Ok(Some(id)) => json!({"line": n, "valid": true, "id": id}),
            // Valid, but `run` cannot dedupe it: say so, in run's words.
            Ok(None) => json!({
                "line": n,
                "valid": true,
                "id": null,
                "dedupe": false,
                "reason": OutcomeKind::FailOpen.reason(),
            }),
            Err((code, reason)) => {
                invalid += 1;
                // Its id where it can be read (a line to find in the queue), as
                // run's verdicts give it.
                let id = Fields::lenient(&line).id;
                let id = (!id.is_empty()).then_some(id);
                json!({"line": n, "valid": false, "id": id, "code": code, "reason": reason})
            }
        };
        // Not println!: it panics when stdout is a closed pipe (`| head -1`).
        bq_dedupe_host::tell(&record.to_string());
    }
    Ok(if invalid == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
