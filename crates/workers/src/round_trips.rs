//! Counts the requests a store client makes (to a Durable Object, KV or D1) and
//! the rows the backend says they read and wrote.

use std::cell::Cell;
use std::rc::Rc;

use serde::{Deserialize, Serialize};

/// Rows read and written, as the backend counts them (what Cloudflare bills):
/// a Durable Object's SQL cursors' `rowsRead` / `rowsWritten`, D1's
/// `meta.rows_read` / `meta.rows_written`; for KV, keys read and keys written or
/// deleted (KV bills each key, a bulk get too).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rows {
    /// Rows (KV: keys) read.
    pub read: u64,
    /// Rows (KV: keys) written or deleted.
    pub written: u64,
}

impl Rows {
    pub(crate) fn add(&mut self, read: u64, written: u64) {
        self.read += read;
        self.written += written;
    }
}

/// A shared request counter: clone it into a store, read it after a batch.
#[derive(Debug, Clone, Default)]
pub struct RoundTrips(Rc<(Cell<u64>, Cell<Rows>)>);

impl RoundTrips {
    /// A counter at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// The requests counted so far.
    pub fn get(&self) -> u64 {
        self.0.0.get()
    }

    /// The rows those requests read and wrote, as the backend reported them.
    pub fn rows(&self) -> Rows {
        self.0.1.get()
    }

    pub(crate) fn add(&self, n: u64) {
        self.0.0.set(self.0.0.get() + n);
    }

    pub(crate) fn add_rows(&self, read: u64, written: u64) {
        let mut rows = self.0.1.get();
        rows.add(read, written);
        self.0.1.set(rows);
    }
}
