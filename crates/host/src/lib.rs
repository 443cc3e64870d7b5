//! The reference wasmtime host of the dedupe component: the runtime (loading and
//! calling the component), the store behind its `store` import, and the handlers
//! behind its `handler` import. The `bq-dedupe` binary (`main.rs`) is the CLI on top.

#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

pub mod compile_cache;
#[cfg(unix)]
mod deadman;
pub mod engine;
pub mod exec;
pub mod handler;
mod host_store;
pub mod keep_alive;
pub mod runtime;
pub mod stopping;
pub mod telemetry;
pub mod wit;

/// The embedded default store when `--store` is absent.
pub const DEFAULT_STORE: &str = "sqlite:.bq-dedupe/seen.db";

/// Where `--store` is read from when it is not given: a spec with a password
/// kept off the command line, which `ps` shows to every user of the machine.
/// An `--exec` handler does not inherit it.
pub const STORE_ENV: &str = "BQ_DEDUPE_STORE";

/// A store spec as it may be printed, every password masked (one function for
/// every command and error: the stores crate's).
pub use bq_dedupe_stores::shown_spec;

/// [`open_store`] for a command that only reads or cleans a store (`show`,
/// `stats`, `purge`, `forget`): a SQLite file or a PostgreSQL table that does
/// not exist is an error, not a new empty store (a mistyped path or `?table=`
/// would look like an empty one).
pub fn open_existing_store(spec: &str) -> anyhow::Result<bq_dedupe_stores::AnyStore> {
    opened(spec, bq_dedupe_stores::AnyStore::from_existing_spec(spec))
}

/// Opens the store of `spec` for a command: an error names the spec masked,
/// and what its connection leaves unauthenticated is said once, on stderr.
pub fn open_store(spec: &str) -> anyhow::Result<bq_dedupe_stores::AnyStore> {
    opened(spec, bq_dedupe_stores::AnyStore::from_spec(spec))
}

/// [`open_store`], and whether the store was made by it (a SQLite file or a
/// PostgreSQL table that was not there: a mistyped spec would make every id
/// run again, so the caller says so). A store with no such notion (memory,
/// Redis) is never "made".
pub fn open_or_make_store(spec: &str) -> anyhow::Result<(bq_dedupe_stores::AnyStore, bool)> {
    use bq_dedupe::store::StoreErrorKind;
    match bq_dedupe_stores::AnyStore::from_existing_spec(spec) {
        // Not there (or a bad spec, which the next open refuses as well).
        Err(e) if e.kind == StoreErrorKind::Invalid => Ok((open_store(spec)?, true)),
        existing => Ok((opened(spec, existing)?, false)),
    }
}

fn opened(
    spec: &str,
    store: Result<bq_dedupe_stores::AnyStore, bq_dedupe::StoreError>,
) -> anyhow::Result<bq_dedupe_stores::AnyStore> {
    use anyhow::Context;
    let shown = || bq_dedupe_stores::shown_store_spec(spec);
    let store = store.with_context(|| format!("opening store {}", shown()))?;
    for note in store.notes() {
        say(&format!("bq-dedupe: note: store {}: {note}", shown()));
    }
    Ok(store)
}

/// A line on stdout, if it can still be written: `println!` panics when
/// stdout is a closed pipe (`bq-dedupe forget a b c | head -1`), which ended
/// `forget` before its later ids were forgotten.
pub fn tell(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout(), "{line}");
}

/// A line on stderr, if it can still be written: `eprintln!` panics when
/// stderr is a closed pipe, which must not end a run (or a signal's handling).
pub fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}
