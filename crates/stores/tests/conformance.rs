//! The vendored BabelQueue conformance manifest through `Guard<AnyStore>`, for
//! every store, in plain and in claiming mode (the core's `GuardSubject`).

mod common;

use std::path::PathBuf;
use std::time::Duration;

use bq_dedupe::Store;
use bq_dedupe::conformance::{self, GuardSubject};
use common::{on_every_backend, unique};

/// Runs the manifest on a fresh guard per mode (`true`: claiming) and prints
/// `NAME: N passed, N failed`.
fn run_manifest_modes<S: Store>(name: &str, modes: &[bool], open: impl Fn() -> S) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/conformance");
    let manifest = std::fs::read_to_string(dir.join("manifest.json")).unwrap();
    for &claiming in modes {
        let label = if claiming {
            format!("{name}-claiming")
        } else {
            name.to_string()
        };
        let mut subject = GuardSubject::new(open()).with_prefix_base(unique("conf") + ":");
        if claiming {
            subject = subject.with_claiming(Duration::from_secs(30));
        }
        let load = |file: &str| std::fs::read(dir.join(file)).map_err(|e| format!("{file}: {e}"));
        let report =
            conformance::run(&manifest, load, &mut subject, |r| println!("{label} {r}")).unwrap();
        println!("{label}: {}", report.summary());
        // 6 envelope cases + dedup_key + 6 sequences.
        assert_eq!(report.results.len(), 13);
        assert_eq!(report.failed(), 0, "{label}: {:#?}", report.results);
    }
}

/// Every backend of the table in each record format, through its spec, in
/// both modes (plain only where the format cannot claim).
#[test]
fn conformance_on_every_backend() {
    on_every_backend("conformance", |subject| {
        let modes: &[bool] = if subject.caps.claim {
            &[false, true]
        } else {
            &[false]
        };
        run_manifest_modes(subject.name(), modes, || subject.open());
    });
}
