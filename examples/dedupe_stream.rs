//! The project's local demo: dedupe a stream of envelopes (JSON lines) and print
//! one decision per line, then the counters.
//!
//! `cargo run --release --example dedupe_stream -- [FILE|-] [--fail ID]...`
//!
//! The handler "processes" a message by printing it; `--fail ID` makes it fail
//! for that `meta.id` on the first attempt, to show retries leaving ids unmarked.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read};
use std::sync::Arc;

use bq_dedupe::{Counters, Guard, InMemoryStore, block_on_ready};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut source = String::from("-");
    let mut fail_once: HashSet<String> = HashSet::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--fail" => fail_once.extend(args.next()),
            _ => source = arg,
        }
    }
    let input: Box<dyn Read> = match source.as_str() {
        "-" => Box::new(std::io::stdin()),
        path => Box::new(std::fs::File::open(path)?),
    };

    let counters = Arc::new(Counters::new());
    let guard = Guard::new(InMemoryStore::new()).with_observer(counters.clone());
    for (n, line) in BufReader::new(input).lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let outcome = block_on_ready(guard.process(line.as_bytes(), async |msg| match msg.id() {
            Some(id) if fail_once.remove(id) => {
                Err(format!("handler failed for {id} (will retry)"))
            }
            _ => Ok(()),
        }))?;
        let id = bq_dedupe::Message::parse_str(&line, &Default::default())
            .ok()
            .and_then(|m| m.id().map(str::to_owned));
        let record = serde_json::json!({
            "line": n + 1,
            "id": id,
            "decision": outcome.kind().code(),
            "then": format!("{:?}", outcome.disposition()).to_lowercase(),
            "reason": outcome.reason(),
        });
        println!("{record}");
    }
    let stats = counters.snapshot();
    eprintln!("summary: {}", serde_json::to_string(&stats)?);
    eprintln!("remembered ids: {}", guard.store().len());
    Ok(())
}
