//! The vendored BabelQueue conformance suite, through the native core.

use std::path::{Path, PathBuf};

use bq_dedupe::conformance::{self, CoreSubject};

fn vendored() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance")
}

#[test]
fn manifest_passes_through_the_core() {
    let dir = vendored();
    let manifest = std::fs::read_to_string(dir.join("manifest.json")).unwrap();
    let load = |file: &str| std::fs::read(dir.join(file)).map_err(|e| format!("{file}: {e}"));
    let report = conformance::run(&manifest, load, &mut CoreSubject::default(), |r| {
        println!("{r}")
    })
    .unwrap();
    println!("conformance: {}", report.summary());
    // 6 envelope cases + dedup_key + 6 sequences.
    assert_eq!(report.results.len(), 13);
    assert_eq!(report.failed(), 0, "{:#?}", report.results);
}

/// Every file under `a`, relative, with its bytes.
fn tree(a: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![a.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let rel = path.strip_prefix(a).unwrap().to_path_buf();
                out.push((rel, std::fs::read(&path).unwrap()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn vendored_copy_matches_shared_suite() {
    let shared = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/conformance");
    if !shared.is_dir() {
        println!(
            "skipped: {} is absent, nothing to compare with",
            shared.display()
        );
        return;
    }
    let (ours, theirs) = (tree(&vendored()), tree(&shared));
    let names = |t: &[(PathBuf, Vec<u8>)]| t.iter().map(|(p, _)| p.clone()).collect::<Vec<_>>();
    assert_eq!(
        names(&ours),
        names(&theirs),
        "file lists differ: re-vendor tests/conformance"
    );
    for ((path, a), (_, b)) in ours.iter().zip(&theirs) {
        assert!(
            a == b,
            "{} drifted from ../shared/conformance: re-vendor it",
            path.display()
        );
    }
}
