//! The wasmtime engine every component of a run is compiled with, with wasmtime's
//! compilation cache on: compiling the dedupe component takes about a quarter of
//! a second, so without the cache every `bq-dedupe` process would spend that
//! before its first line. The first run of a component compiles and writes the
//! cache; later runs of the same component with the same wasmtime load it.
//!
//! - `BQ_DEDUPE_CACHE=off`: no cache (every run compiles).
//! - `BQ_DEDUPE_CACHE_DIR=DIR`: the cache lives in DIR (made absolute) instead of
//!   wasmtime's default (`~/.cache/wasmtime` on Linux, shared with the wasmtime
//!   CLI; entries are keyed by the component's bytes and the engine's settings).
//!
//! - `BQ_DEDUPE_PERFMAP=1`: wasmtime writes a perf map of the compiled guest
//!   code, so `perf report` names the guest's functions (for profiling).
//!
//! A cache that cannot be set up (no home directory, a read-only one) is not an
//! error: the run compiles instead, and says why on stderr only when
//! `BQ_DEDUPE_CACHE_DIR` asked for a directory.

use std::path::PathBuf;
use std::sync::OnceLock;

use wasmtime::{Cache, CacheConfig, Config, Engine};

/// How often the handler plugins' engine advances its epoch: the grain of
/// `--handler-timeout` for a plugin.
pub const EPOCH_TICK: std::time::Duration = std::time::Duration::from_millis(10);

/// The engine handler plugins run on: the process engine's settings plus epoch
/// interruption, its epoch advanced every [`EPOCH_TICK`] by a thread of its
/// own, so a plugin that never returns can be stopped (a store's deadline, in
/// ticks, is `--handler-timeout`). The dedupe component stays on [`engine`],
/// which pays no epoch checks.
pub fn interruptible_engine() -> Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE
        .get_or_init(|| {
            let engine = make_engine_with(|config| {
                config.epoch_interruption(true);
            });
            let ticking = engine.clone();
            std::thread::spawn(move || {
                loop {
                    std::thread::sleep(EPOCH_TICK);
                    ticking.increment_epoch();
                }
            });
            engine
        })
        .clone()
}

/// The engine for this process, made on first use and shared (a clone is a
/// handle): the component and a handler plugin use one cache.
pub fn engine() -> Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(make_engine).clone()
}

fn make_engine() -> Engine {
    make_engine_with(|_| {})
}

fn make_engine_with(settings: impl Fn(&mut Config)) -> Engine {
    let mut config = Config::new();
    settings(&mut config);
    if std::env::var_os("BQ_DEDUPE_CACHE").is_none_or(|v| v != "off") {
        let dir = std::env::var_os("BQ_DEDUPE_CACHE_DIR").map(absolute);
        match compile_cache(dir.clone()) {
            Ok(cache) => {
                config.cache(Some(cache));
            }
            Err(e) if dir.is_some() => {
                eprintln!("bq-dedupe: compilation cache off: {e:#}");
            }
            Err(_) => {}
        }
    }
    if std::env::var_os("BQ_DEDUPE_PERFMAP").is_some_and(|v| v == "1") {
        let mut profiled = config.clone();
        profiled.profiler(wasmtime::ProfilingStrategy::PerfMap);
        match Engine::new(&profiled) {
            Ok(engine) => return engine,
            Err(e) => eprintln!("bq-dedupe: BQ_DEDUPE_PERFMAP: no perf map: {e:#}"),
        }
    }
    // A `Config` with the defaults and a cache is always valid; were it not,
    // the same settings without the cache are (so the plugins' engine keeps
    // its epoch interruption).
    Engine::new(&config)
        .or_else(|_| {
            let mut plain = Config::new();
            settings(&mut plain);
            Engine::new(&plain)
        })
        .unwrap_or_default()
}

fn compile_cache(dir: Option<PathBuf>) -> wasmtime::Result<Cache> {
    let mut config = CacheConfig::new();
    if let Some(dir) = dir {
        config.with_directory(dir);
    }
    Cache::new(config)
}

fn absolute(dir: std::ffi::OsString) -> PathBuf {
    let dir = PathBuf::from(dir);
    std::path::absolute(&dir).unwrap_or(dir)
}
