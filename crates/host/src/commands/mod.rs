//! One module per subcommand.

pub mod admin;
pub mod check;
pub mod conformance;
pub mod run;

use std::io::{BufRead, BufReader, Read};

use anyhow::{Context, Result};
use bq_dedupe::{Limits, Message, Rejection};

/// The verdict on a line that cannot cross into the component (it takes strings):
/// the core's own, so the reason reads as the component's would.
pub fn reject_bytes(line: &[u8]) -> Rejection {
    Message::parse(line, &Limits::default())
        .err()
        .unwrap_or_else(|| Rejection::NotJson("invalid UTF-8".into()))
}

/// Lines of a file, or of stdin for `-`, as raw bytes (a line that is not UTF-8
/// is still a line, to be rejected rather than stop the stream).
pub fn lines(input: &str) -> Result<impl Iterator<Item = std::io::Result<Vec<u8>>> + Send + use<>> {
    let reader: Box<dyn Read + Send> = match input {
        "-" => Box::new(std::io::stdin()),
        path => Box::new(std::fs::File::open(path).with_context(|| format!("opening {path}"))?),
    };
    let mut reader = BufReader::with_capacity(1 << 16, reader);
    Ok(std::iter::from_fn(move || {
        let mut line = Vec::new();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) => None,
            Ok(_) => {
                while line.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                    line.pop();
                }
                Some(Ok(line))
            }
            Err(e) => Some(Err(e)),
        }
    }))
}
