//! Writes the deterministic benchmark workload as JSON lines.
//!
//! ```text
//! cargo run --release --example gen_workload -- PATH [N]
//! ```
//!
//! `N` defaults to 1,000,000 lines; 20% of them are byte-identical redeliveries of
//! an earlier line. The bytes are exactly those `bench/throughput.rs` builds in
//! memory, so the Python peer (`bench/python_peer.py`) reads the same workload.

#[path = "../bench/workload.rs"]
mod workload;

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let Some(path) = args.next().map(PathBuf::from) else {
        eprintln!(
            "usage: gen_workload PATH [N]   (N defaults to {})",
            workload::DEFAULT_LINES
        );
        return ExitCode::from(2);
    };
    let n = match args
        .next()
        .map(|a| a.to_string_lossy().replace('_', "").parse::<usize>())
    {
        None => workload::DEFAULT_LINES,
        Some(Ok(n)) if n > 0 => n,
        Some(_) => {
            eprintln!("gen_workload: N must be a positive integer");
            return ExitCode::from(2);
        }
    };

    let lines = workload::generate(n);
    let distinct = workload::count_distinct_ids(&lines);

    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if let Err(e) = std::fs::create_dir_all(dir) {
            eprintln!("gen_workload: cannot create {}: {e}", dir.display());
            return ExitCode::FAILURE;
        }
    }
    let written = File::create(&path).and_then(|file| {
        let mut out = BufWriter::with_capacity(1 << 20, file);
        for line in &lines {
            out.write_all(line.as_bytes())?;
            out.write_all(b"\n")?;
        }
        out.flush()
    });
    if let Err(e) = written {
        eprintln!("gen_workload: cannot write {}: {e}", path.display());
        return ExitCode::FAILURE;
    }

    let bytes: usize = lines.iter().map(|l| l.len() + 1).sum();
    // FNV-1a over the file's bytes, to check that two runs (or machines) agree.
    let mut fnv: u64 = 0xcbf2_9ce4_8422_2325;
    for line in &lines {
        for &b in line.as_bytes().iter().chain(b"\n") {
            fnv = (fnv ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    println!("path: {}", path.display());
    println!("lines: {}", lines.len());
    println!("bytes: {bytes}");
    println!(
        "average line size: {:.1} bytes (incl. newline)",
        bytes as f64 / lines.len() as f64
    );
    println!("distinct ids: {distinct}");
    println!("redeliveries: {}", lines.len() - distinct);
    println!("fnv1a64: {fnv:016x}");
    ExitCode::SUCCESS
}
