//! `bq-componentize CORE.wasm OUT.component.wasm`
//!
//! Turns the guest's core module (built by `cargo build --target
//! wasm32-unknown-unknown`, with the `component-type` section wit-bindgen embeds)
//! into a component with `wit-component`, validates it, writes it, prints its
//! top-level imports and exports, and fails if anything but
//! `babelqueue:idempotency/...` is imported (in particular: no WASI).

use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use wasmparser::{Parser, Payload};
use wit_component::ComponentEncoder;

/// The only namespace the component may import from.
const ALLOWED_IMPORT_PREFIX: &str = "babelqueue:idempotency/";

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bq-componentize: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [input, output] = args.as_slice() else {
        bail!("usage: bq-componentize CORE.wasm OUT.component.wasm");
    };
    let module = std::fs::read(input).with_context(|| format!("reading {input}"))?;
    let component = ComponentEncoder::default()
        .module(&module)
        .context("the core module has no usable component-type section")?
        .validate(true)
        .encode()
        .context("encoding the component")?;

    let (imports, exports) = top_level_names(&component)?;
    for name in &imports {
        println!("import {name}");
    }
    for name in &exports {
        println!("export {name}");
    }
    let foreign: Vec<&String> = imports
        .iter()
        .filter(|name| !name.starts_with(ALLOWED_IMPORT_PREFIX))
        .collect();
    if !foreign.is_empty() {
        bail!("the component imports {foreign:?}; only {ALLOWED_IMPORT_PREFIX}* is allowed");
    }
    let component = strip_custom_sections(&component, &["component-name", "producers"])?;
    std::fs::write(output, &component).with_context(|| format!("writing {output}"))?;
    Ok(())
}

/// Drops the named top-level custom sections (debug names, tool versions: about
/// 3.7 KB that no host needs). Nested modules and components are left as they are.
fn strip_custom_sections(component: &[u8], names: &[&str]) -> Result<Vec<u8>> {
    fn leb(bytes: &[u8], mut at: usize) -> Result<(usize, usize)> {
        let (mut value, mut shift) = (0usize, 0);
        loop {
            let byte = *bytes.get(at).context("truncated section header")?;
            at += 1;
            value |= usize::from(byte & 0x7f) << shift;
            shift += 7;
            if byte < 0x80 {
                return Ok((value, at));
            }
        }
    }
    let mut out = component.get(..8).context("not a component")?.to_vec();
    let mut at = 8;
    while at < component.len() {
        let (size, body) = leb(component, at + 1)?;
        let end = body + size;
        let section = component.get(at..end).context("truncated section")?;
        let dropped = component[at] == 0 && {
            let (len, name_at) = leb(component, body)?;
            names.iter().any(|n| component.get(name_at..name_at + len) == Some(n.as_bytes()))
        };
        if !dropped {
            out.extend_from_slice(section);
        }
        at = end;
    }
    wasmparser::Validator::new_with_features(wasmparser::WasmFeatures::all())
        .validate_all(&out)
        .context("the component no longer validates after stripping")?;
    Ok(out)
}

/// The component's own imports and exports: those of nested modules and
/// components (the core module's imports from the canonical-ABI shims) are skipped.
fn top_level_names(component: &[u8]) -> Result<(Vec<String>, Vec<String>)> {
    let (mut imports, mut exports) = (Vec::new(), Vec::new());
    let mut depth = 0usize;
    for payload in Parser::new(0).parse_all(component) {
        match payload? {
            Payload::ModuleSection { .. } | Payload::ComponentSection { .. } => depth += 1,
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentImportSection(reader) if depth == 0 => {
                for import in reader {
                    imports.push(import?.name.name.to_string());
                }
            }
            Payload::ComponentExportSection(reader) if depth == 0 => {
                for export in reader {
                    exports.push(export?.name.name.to_string());
                }
            }
            _ => {}
        }
    }
    Ok((imports, exports))
}
