//! The README's snippets are the files they name, and those files work: every
//! fenced block right after a `<!-- file: PATH -->` marker must equal PATH's text,
//! and one after `<!-- from: PATH -->` must appear in PATH verbatim (the JS
//! package's README, whose examples its pack test runs).
//! The files are compiled (examples/, examples/user-worker) or run by other tests;
//! here the envelope is decoded and the quick start is run.

use std::path::Path;
use std::process::Command;

use bq_dedupe::{Message, envelope::Limits};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// How a snippet relates to the file it names.
#[derive(Debug, PartialEq)]
enum Mark {
    /// The whole file.
    File,
    /// A passage of it.
    From,
}

/// (mark, path, block) for every marked snippet of `doc`.
fn snippets(doc: &str) -> Vec<(Mark, String, String)> {
    let mut out = Vec::new();
    let mut lines = doc.lines();
    while let Some(line) = lines.next() {
        let line = line.trim();
        let (mark, rest) = if let Some(rest) = line.strip_prefix("<!-- file: ") {
            (Mark::File, rest)
        } else if let Some(rest) = line.strip_prefix("<!-- from: ") {
            (Mark::From, rest)
        } else {
            continue;
        };
        let Some(path) = rest.strip_suffix(" -->") else {
            continue;
        };
        let fence = lines.next().unwrap_or_default();
        assert!(
            fence.starts_with("```"),
            "{path}: a fenced block must follow its marker"
        );
        let block: Vec<&str> = lines
            .by_ref()
            .take_while(|l| !l.starts_with("```"))
            .collect();
        out.push((mark, path.to_string(), block.join("\n")));
    }
    out
}

#[test]
fn readme_snippets_are_the_files_they_name() {
    // The README, and the docs pages whose snippets are compiled files too.
    let found: Vec<_> = ["README.md", "docs/component.md", "docs/workers.md"]
        .iter()
        .flat_map(|doc| snippets(&std::fs::read_to_string(root().join(doc)).unwrap()))
        .collect();
    let paths: Vec<&str> = found.iter().map(|(_, p, _)| p.as_str()).collect();
    assert!(found.len() >= 6, "marked snippets: {paths:?}");
    for (mark, path, block) in &found {
        let file = std::fs::read_to_string(root().join(path))
            .unwrap_or_else(|e| panic!("README names {path}: {e}"));
        match mark {
            Mark::File => assert_eq!(
                block.trim_end(),
                file.trim_end(),
                "README's copy of {path} differs from the file"
            ),
            Mark::From => assert!(
                file.contains(block.trim_end()),
                "README's snippet is not in {path}:\n{block}"
            ),
        }
    }
}

#[test]
fn readme_minimal_envelope_is_valid() {
    let body = std::fs::read(root().join("examples/minimal-envelope.json")).unwrap();
    let msg = Message::parse(&body, &Limits::default()).expect("the README's envelope is accepted");
    assert_eq!(msg.id(), Some("5f0c8a4e-2b1d-4c3a-9e8f-0a1b2c3d4e5f"));
}

#[test]
fn readme_quick_start_runs_then_skips() {
    // `cargo test --all-targets` builds examples as test harnesses, not as the program a
    // user runs; the plain binary comes from `cargo build --example quickstart`, which
    // `make unit` runs first (a nested cargo here would wait on the build lock).
    let exe = std::env::current_exe().unwrap();
    let examples = exe
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .join("examples");
    let out = Command::new(examples.join("quickstart"))
        .output()
        .expect("examples/quickstart is built: run `cargo build --example quickstart` first");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("delivery 1: run-ok") && stdout.contains("delivery 2: skip"),
        "{stdout}"
    );
    assert_eq!(stdout.matches("charging order").count(), 1, "{stdout}");
}
