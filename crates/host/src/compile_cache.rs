//! The cache of compiled components: compiling the dedupe component takes about a
//! quarter of a second, so without it every `bq-dedupe` process would spend that
//! before its first line. The first run of a component compiles it and writes an
//! entry; later runs of the same component, on the same engine settings, load it.
//!
//! An entry is one file, `<key>.cwasm`: the SHA-256 of the rest, then the
//! component as wasmtime serializes it. wasmtime runs a serialized component
//! trusting its bytes, so an entry is loaded only when its digest matches; any
//! other is compiled and written afresh. wasmtime's own cache trusted them: one
//! flipped bit in an entry ran messages twice, hung or crashed every later run
//! (a review's finding).
//!
//! - `BQ_DEDUPE_CACHE=off`: no cache (every run compiles).
//! - `BQ_DEDUPE_CACHE_DIR=DIR`: the cache lives in DIR (made absolute), instead of
//!   `$XDG_CACHE_HOME/bq-dedupe` or `~/.cache/bq-dedupe`.
//!
//! A cache that cannot be used (no home directory, a read-only one) is not an
//! error: the run compiles instead, and says why on stderr only when
//! `BQ_DEDUPE_CACHE_DIR` asked for a directory.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

/// The component `wasm` compiled for `engine`: from the cache when it holds a
/// sound entry, else compiled (and written there).
pub fn component(engine: &Engine, wasm: &[u8]) -> wasmtime::Result<Component> {
    match dir() {
        Some(dir) => cached(dir, engine, wasm),
        None => Component::new(engine, wasm),
    }
}

/// The cache's directory, made on first use; `None` when it is off or unusable.
fn dir() -> Option<&'static Path> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        if std::env::var_os("BQ_DEDUPE_CACHE").is_some_and(|v| v == "off") {
            return None;
        }
        let asked = std::env::var_os("BQ_DEDUPE_CACHE_DIR").map(PathBuf::from);
        let dir = match &asked {
            Some(dir) => std::path::absolute(dir).unwrap_or_else(|_| dir.clone()),
            None => default_dir()?,
        };
        match std::fs::create_dir_all(&dir) {
            Ok(()) => Some(dir),
            Err(e) => {
                if asked.is_some() {
                    crate::say(&format!(
                        "bq-dedupe: compilation cache off: {}: {e}",
                        dir.display()
                    ));
                }
                None
            }
        }
    })
    .as_deref()
}

fn default_dir() -> Option<PathBuf> {
    let xdg = std::env::var_os("XDG_CACHE_HOME").map(PathBuf::from);
    let home = || std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache"));
    Some(
        xdg.filter(|d| d.is_absolute())
            .or_else(home)?
            .join("bq-dedupe"),
    )
}

fn cached(dir: &Path, engine: &Engine, wasm: &[u8]) -> wasmtime::Result<Component> {
    let path = dir.join(format!("{}.cwasm", key(engine, wasm)));
    if let Some(component) = std::fs::read(&path)
        .ok()
        .and_then(|entry| load(engine, &entry))
    {
        return Ok(component);
    }
    let compiled = engine.precompile_component(wasm)?;
    // SAFETY: the bytes this engine's precompile just made.
    let component = unsafe { Component::deserialize(engine, &compiled)? };
    // Written whole, then renamed: a reader never sees half an entry. A cache
    // that cannot be written only costs the next run a compile.
    let mut entry = Sha256::digest(&compiled).to_vec();
    entry.extend_from_slice(&compiled);
    let partial = path.with_extension(format!("{}.partial", std::process::id()));
    let written = std::fs::write(&partial, &entry).and_then(|()| std::fs::rename(&partial, &path));
    if written.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    Ok(component)
}

/// An entry's component, if its digest matches what it holds.
fn load(engine: &Engine, entry: &[u8]) -> Option<Component> {
    let (digest, compiled) = entry.split_at_checked(32)?;
    if Sha256::digest(compiled).as_slice() != digest {
        return None;
    }
    // SAFETY: `compiled` is what `precompile_component` wrote for an engine of
    // these settings (the key says so), byte for byte (the digest says so);
    // wasmtime checks its header against this engine's before use.
    unsafe { Component::deserialize(engine, compiled) }.ok()
}

/// The entry's name: the component's SHA-256 and the engine's settings and
/// wasmtime version (an entry compiled otherwise cannot be loaded).
fn key(engine: &Engine, wasm: &[u8]) -> String {
    let mut settings = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut settings);
    let wasm = Sha256::digest(wasm);
    let hex: String = wasm.iter().map(|b| format!("{b:02x}")).collect();
    format!("{hex}-{:016x}", settings.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A component that imports and exports nothing, as a binary.
    const EMPTY: &[u8] = b"\0asm\x0d\0\x01\0";

    #[test]
    fn an_entry_with_one_bit_flipped_is_not_loaded_and_is_written_afresh() {
        let engine = Engine::default();
        let dir = std::env::temp_dir().join(format!("bq-cache-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        cached(&dir, &engine, EMPTY).expect("compiles");
        let path = dir.join(format!("{}.cwasm", key(&engine, EMPTY)));
        let sound = std::fs::read(&path).expect("an entry was written");
        assert!(load(&engine, &sound).is_some(), "a sound entry loads");
        for at in [0, 31, 32, sound.len() / 2, sound.len() - 1] {
            let mut flipped = sound.clone();
            flipped[at] ^= 0x10;
            assert!(load(&engine, &flipped).is_none(), "a flipped bit at {at}");
            std::fs::write(&path, &flipped).unwrap();
            cached(&dir, &engine, EMPTY).expect("compiled again");
            assert_eq!(std::fs::read(&path).unwrap(), sound, "written afresh");
        }
        assert!(load(&engine, &sound[..20]).is_none(), "a short entry");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
