//! Builds the dedupe component into the binary, so an installed `bq-dedupe` needs
//! no file next to it: the component `scripts/build-component.sh` wrote (or the
//! one `BQ_DEDUPE_COMPONENT_WASM` names) is copied to `OUT_DIR`. Without one the
//! binary is built without it and asks for `--component` at run time.

use std::path::PathBuf;

fn main() {
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let workspace_build = manifest_dir.join("../../target/component/bq_dedupe.component.wasm");
    println!("cargo:rerun-if-env-changed=BQ_DEDUPE_COMPONENT_WASM");
    println!("cargo:rerun-if-changed={}", workspace_build.display());
    let source = std::env::var_os("BQ_DEDUPE_COMPONENT_WASM")
        .map(PathBuf::from)
        .unwrap_or(workspace_build);
    let out = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default()).join("component.wasm");
    // An empty file means "none built in".
    let bytes = std::fs::read(&source).unwrap_or_default();
    if bytes.is_empty() {
        println!(
            "cargo:warning=no dedupe component at {} to build in; run scripts/build-component.sh first \
             (or set BQ_DEDUPE_COMPONENT_WASM), else bq-dedupe needs --component",
            source.display()
        );
    }
    std::fs::write(&out, bytes).expect("OUT_DIR is writable");
}
