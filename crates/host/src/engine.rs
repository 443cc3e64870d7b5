//! The wasmtime engines of a run: one for the dedupe component, one with epoch
//! interruption for handler plugins. Compiled components are cached between runs
//! ([`crate::compile_cache`]).
//!
//! - `BQ_DEDUPE_PERFMAP=1`: wasmtime writes a perf map of the compiled guest
//!   code, so `perf report` names the guest's functions (for profiling).

use std::sync::OnceLock;

use wasmtime::{Config, Engine};

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
/// handle).
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
    if std::env::var_os("BQ_DEDUPE_PERFMAP").is_some_and(|v| v == "1") {
        let mut profiled = config.clone();
        profiled.profiler(wasmtime::ProfilingStrategy::PerfMap);
        match Engine::new(&profiled) {
            Ok(engine) => return engine,
            Err(e) => crate::say(&format!("bq-dedupe: BQ_DEDUPE_PERFMAP: no perf map: {e:#}")),
        }
    }
    // The defaults and epoch interruption are always a valid `Config`.
    Engine::new(&config).unwrap_or_default()
}
