//! Runs a BabelQueue conformance manifest through the native core.
//!
//! `cargo run --example conformance -- [MANIFEST]` (default: the vendored suite).
//! Prints `ok NAME` / `FAIL NAME: why` per case, then `N passed, N failed`, and
//! exits non-zero on any failure.

use std::path::PathBuf;

use bq_dedupe::conformance::{self, CoreSubject};

fn main() {
    let manifest = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/conformance/manifest.json")
        });
    let dir = manifest.parent().map(PathBuf::from).unwrap_or_default();
    let report = std::fs::read_to_string(&manifest)
        .map_err(|e| format!("{}: {e}", manifest.display()))
        .and_then(|text| {
            let load =
                |file: &str| std::fs::read(dir.join(file)).map_err(|e| format!("{file}: {e}"));
            conformance::run(&text, load, &mut CoreSubject::default(), |r| {
                println!("{r}")
            })
        });
    match report {
        Ok(report) => {
            println!("{}", report.summary());
            std::process::exit(if report.failed() == 0 { 0 } else { 1 });
        }
        Err(e) => {
            eprintln!("conformance: {e}");
            std::process::exit(2);
        }
    }
}
