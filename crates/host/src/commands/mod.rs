//! One module per subcommand.

pub mod admin;
pub mod check;
pub mod conformance;
pub mod run;

use std::io::{BufRead, BufReader, Read};

use anyhow::{Context, Result};
use bq_dedupe::{Message, envelope::Limits, envelope::Rejection};

/// The verdict on a line that cannot cross into the component (it takes strings):
/// the core's own, so the reason reads as the component's would.
pub fn reject_bytes(line: &[u8]) -> Rejection {
    Message::parse(line, &Limits::default())
        .err()
        .unwrap_or_else(|| Rejection::NotJson("invalid UTF-8".into()))
}

/// The verdict on a line [`Lines`] cut at the read limit: too large, with its
/// whole size (the component would see only the bytes read).
pub fn reject_cut(size: usize) -> Rejection {
    Rejection::TooLarge {
        size,
        limit: Limits::default().max_bytes,
    }
}

/// Lines of a file, or of stdin for `-`, as raw bytes (a line that is not UTF-8
/// is still a line, to be rejected rather than stop the stream), without their
/// line ending, read through a 1 MiB buffer (a chunk of lines is what one
/// buffer holds, and each chunk is a hand-off between threads: see `run`).
pub struct Lines {
    reader: BufReader<Box<dyn Read + Send>>,
    /// Where a line is read before it is copied out at its exact length.
    scratch: Vec<u8>,
    /// The whole size of the line just returned, when it was over the read
    /// limit and cut there (see [`Lines::cut`]).
    cut: Option<usize>,
}

impl Lines {
    pub fn open(input: &str) -> Result<Self> {
        let reader: Box<dyn Read + Send> = match input {
            "-" => Box::new(std::io::stdin()),
            // Shown as a spec is: a store spec given as the input (`--store`
            // forgotten) must not print its password.
            path => {
                let shown = bq_dedupe_host::shown_spec(path);
                let file = std::fs::File::open(path).with_context(|| format!("opening {shown}"))?;
                // A directory opens; only its first read fails, naming no path.
                if file.metadata().is_ok_and(|m| m.is_dir()) {
                    anyhow::bail!("opening {shown}: it is a directory, not a file of envelopes");
                }
                Box::new(file)
            }
        };
        Ok(Lines {
            reader: BufReader::with_capacity(1 << 20, reader),
            scratch: Vec::new(),
            cut: None,
        })
    }

    /// Whether a whole next line is already buffered, so reading it needs no
    /// wait for the source (the start of a line alone may wait for its end).
    pub fn buffered(&self) -> bool {
        self.reader.buffer().contains(&b'\n')
    }
}

/// The most of `Lines::scratch` kept from one line to the next.
const SCRATCH_KEPT: usize = 1 << 20;

/// The most of one line read into memory: one byte over the envelope limit
/// (`Limits::max_bytes`), so a longer line is still rejected as too large,
/// while the rest of it is skipped as it is read, never held; and one more, so
/// a line of exactly the limit ending in `\r\n` is read whole.
const LINE_READ_LIMIT: usize = (1 << 20) + 2;

impl Lines {
    /// The line just returned was over the envelope limit: its whole size in
    /// bytes (what was returned is its first bytes only). Such a line is
    /// rejected as too large, with this size.
    pub fn cut(&self) -> Option<usize> {
        self.cut
    }

    /// Skips the rest of the current line (up to and with its newline): how
    /// many bytes it had before its newline, and the last of them.
    fn skip_line(&mut self) -> std::io::Result<(usize, Option<u8>)> {
        let (mut skipped, mut last) = (0, None);
        loop {
            let buf = self.reader.fill_buf()?;
            if buf.is_empty() {
                return Ok((skipped, last));
            }
            match buf.iter().position(|&b| b == b'\n') {
                Some(at) => {
                    let last = if at > 0 { Some(buf[at - 1]) } else { last };
                    self.reader.consume(at + 1);
                    return Ok((skipped + at, last));
                }
                None => {
                    let n = buf.len();
                    skipped += n;
                    last = buf.last().copied();
                    self.reader.consume(n);
                }
            }
        }
    }
}

impl Iterator for Lines {
    type Item = std::io::Result<Vec<u8>>;

    fn next(&mut self) -> Option<Self::Item> {
        // One huge line must not keep its buffer for the rest of the run.
        if self.scratch.capacity() > SCRATCH_KEPT {
            self.scratch = Vec::new();
        }
        self.scratch.clear();
        self.cut = None;
        let mut limited = (&mut self.reader).take(LINE_READ_LIMIT as u64);
        match limited.read_until(b'\n', &mut self.scratch) {
            Ok(0) => None,
            Ok(_) => {
                if self.scratch.len() >= LINE_READ_LIMIT && self.scratch.last() != Some(&b'\n') {
                    // Cut off: kept as read (over the limit, so rejected as too
                    // large), no line ending stripped that would bring it under.
                    let read = self.scratch.len();
                    return Some(self.skip_line().map(|(rest, last)| {
                        // A `\r` before the newline is the line ending's, as
                        // for a line that was not cut.
                        let last = if rest > 0 {
                            last
                        } else {
                            self.scratch.last().copied()
                        };
                        let ending = usize::from(last == Some(b'\r'));
                        self.cut = Some(read + rest - ending);
                        self.scratch.clone()
                    }));
                }
                let mut line = self.scratch.as_slice();
                while let [rest @ .., b'\n' | b'\r'] = line {
                    line = rest;
                }
                Some(Ok(line.to_vec()))
            }
            Err(e) => Some(Err(e)),
        }
    }
}
