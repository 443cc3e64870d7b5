//! The component's imported `handler`: what "processing a message" means for this
//! host run.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use wasmtime::component::{Component, Linker, WasmStr};
use wasmtime::{Store, StoreContextMut};

pub use crate::exec::ExecHandler;
use crate::runtime::HostState;
use crate::wit::dedupe::babelqueue::idempotency::handler;
use crate::wit::plugin::HandlerPlugin;

/// What handles each delivery the guard runs: nothing, `--exec`, `--handler` or a script.
#[derive(Debug)]
pub enum Handler {
    /// No handler: record the delivery as if it succeeded (a "mark" run).
    Mark,
    /// A shell command per message, the envelope on stdin; exit 0 = success.
    Exec(ExecHandler),
    /// A component exporting the WIT `handler` interface.
    Plugin(Box<Plugin>),
    /// Succeeds or fails as told (the conformance runner's scripted handler).
    Scripted {
        /// Whether every call succeeds.
        succeed: bool,
        /// The calls made so far.
        calls: u64,
    },
}

impl Handler {
    /// Whether this handler looks at the envelope at all (a mark or a scripted
    /// run does not).
    fn reads_envelope(&self) -> bool {
        match self {
            Handler::Exec(_) | Handler::Plugin(_) => true,
            Handler::Mark | Handler::Scripted { .. } => false,
        }
    }

    /// Runs on `envelope`; an `--exec` handler with `trace` in its
    /// environment (its delivery's trace context).
    fn handle(&mut self, envelope: &str, trace: &[(&str, String)]) -> Result<(), String> {
        if let (Some(signal), Handler::Exec(_) | Handler::Plugin(_)) =
            (crate::stopping::requested(), &self)
        {
            return Err(crate::stopping::not_run(signal));
        }
        match self {
            Handler::Mark => Ok(()),
            Handler::Exec(exec) => exec.handle(envelope, trace),
            Handler::Plugin(plugin) => plugin.handle(envelope),
            Handler::Scripted { succeed, calls } => {
                *calls += 1;
                if *succeed {
                    Ok(())
                } else {
                    Err("scripted failure".into())
                }
            }
        }
    }
}

impl handler::Host for HostState {
    fn handle(&mut self, envelope: String) -> Result<(), String> {
        let HostState {
            store,
            handler,
            claims,
            ran_ok,
            spans,
        } = self;
        let trace = match (spans, &handler) {
            (Some(spans), Handler::Exec(_)) => spans.handler_env(&envelope),
            _ => Vec::new(),
        };
        let result = match handler {
            // Work of unknown length: keep the guest's claims alive meanwhile.
            Handler::Exec(_) | Handler::Plugin(_) if !claims.is_empty() => {
                claims.kept_alive_during(store, || handler.handle(&envelope, &trace))
            }
            _ => handler.handle(&envelope, &trace),
        };
        if result.is_ok() && handler.reads_envelope() {
            ran_ok.push(crate::runtime::envelope_hash(&envelope));
        }
        result
    }
}

/// Binds the component's `handler.handle` import by hand, over the binding
/// `bindgen!` made, so that the envelope arrives as a [`WasmStr`] (a place in
/// the guest's memory) and is read out only by a handler that reads it: a mark
/// run (`bq-dedupe run` without `--exec` or `--handler`) then copies and checks
/// nothing per delivery. The bindgen binding stays the reference: this one
/// calls the same [`handler::Host::handle`] once it has the text.
pub fn bind_lazily(linker: &mut Linker<HostState>, component: &Component) -> Result<()> {
    // The import's name as the component spells it (with its package version).
    let ty = component.component_type();
    let Some(name) = ty
        .imports(component.engine())
        .map(|(name, _)| name)
        // The 1.x track bindgen's binding is for (its functions unchanged within it).
        .find(|name| name.starts_with("babelqueue:idempotency/handler@1."))
    else {
        return Ok(());
    };
    linker.allow_shadowing(true);
    let bound = linker.instance(name).and_then(|mut instance| {
        instance.func_wrap(
            "handle",
            |mut cx: StoreContextMut<'_, HostState>, (envelope,): (WasmStr,)| {
                if !cx.data().handler.reads_envelope() {
                    return Ok((cx.data_mut().handler.handle("", &[]),));
                }
                let envelope = envelope.to_str(&cx)?.into_owned();
                Ok((handler::Host::handle(cx.data_mut(), envelope),))
            },
        )
    });
    linker.allow_shadowing(false);
    Ok(bound?)
}

/// A handler component in its own store (it shares nothing with the dedupe
/// component), on the interruptible engine: a call that runs past `timeout`
/// traps, and the delivery fails like an `--exec` handler's that timed out.
pub struct Plugin {
    component: Component,
    linker: Linker<()>,
    store: Store<()>,
    bindings: HandlerPlugin,
    timeout: Duration,
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin").finish_non_exhaustive()
    }
}

impl Plugin {
    /// Loads and instantiates the handler component at `path`; each call may
    /// run for `timeout` (`--handler-timeout`).
    pub fn load(path: &Path, timeout: Duration) -> Result<Self> {
        let engine = crate::engine::interruptible_engine();
        let component = (std::fs::read(path).map_err(anyhow::Error::from))
            .and_then(|wasm| {
                crate::compile_cache::component(&engine, &wasm).map_err(anyhow::Error::from)
            })
            .with_context(|| format!("loading handler plugin {}", path.display()))?;
        let linker = Linker::new(&engine);
        let mut store = deadlined(&engine, timeout);
        let bindings = HandlerPlugin::instantiate(&mut store, &component, &linker)
            .map_err(anyhow::Error::from)
            .with_context(|| format!("instantiating handler plugin {}", path.display()))?;
        Ok(Plugin {
            component,
            linker,
            store,
            bindings,
            timeout,
        })
    }

    fn handle(&mut self, envelope: &str) -> Result<(), String> {
        self.store.set_epoch_deadline(ticks(self.timeout));
        match self
            .bindings
            .babelqueue_idempotency_handler()
            .call_handle(&mut self.store, envelope)
        {
            Ok(result) => result.map_err(cut),
            Err(trap) => {
                // A trapped instance (and its whole store) cannot be entered again:
                // a fresh store and instance; the message is retried.
                let mut store = deadlined(self.component.engine(), self.timeout);
                if let Ok(fresh) =
                    HandlerPlugin::instantiate(&mut store, &self.component, &self.linker)
                {
                    self.store = store;
                    self.bindings = fresh;
                }
                match trap.downcast_ref::<wasmtime::Trap>() {
                    Some(wasmtime::Trap::Interrupt) => Err(format!(
                        "handler plugin ran past --handler-timeout ({}) and was stopped",
                        crate::exec::shown(self.timeout)
                    )),
                    _ => Err(format!("handler plugin trapped: {trap}")),
                }
            }
        }
    }
}

/// How much of a plugin's error message a reason keeps.
const REASON_BYTES: usize = 4096;

/// A plugin's error message, its start kept: the whole of a huge one went into
/// the dedupe component, which trapped copying it (the batch's every line a
/// `failed` trap), or into each verdict line.
fn cut(message: String) -> String {
    if message.len() <= REASON_BYTES {
        return message;
    }
    let end = (0..=REASON_BYTES)
        .rev()
        .find(|&i| message.is_char_boundary(i))
        .unwrap_or(0);
    format!("{}... (cut: {} bytes)", &message[..end], message.len())
}

/// Epoch ticks in `timeout`, plus one: the deadline counts from the current
/// epoch, whose next tick may be due at once, so a call is never stopped
/// before `timeout` (and at most a tick after it).
fn ticks(timeout: Duration) -> u64 {
    let tick = crate::engine::EPOCH_TICK.as_nanos();
    u64::try_from(timeout.as_nanos().div_ceil(tick))
        .unwrap_or(u64::MAX - 1)
        .saturating_add(1)
}

/// A store whose calls may each run for `timeout` (instantiation included).
fn deadlined(engine: &wasmtime::Engine, timeout: Duration) -> Store<()> {
    let mut store = Store::new(engine, ());
    store.set_epoch_deadline(ticks(timeout));
    store
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deadline one tick long could fire a moment after it was set.
    #[test]
    fn a_deadline_is_never_shorter_than_its_timeout() {
        assert_eq!(ticks(Duration::from_millis(1)), 2);
        assert_eq!(ticks(Duration::from_millis(10)), 2);
        assert_eq!(ticks(Duration::from_millis(11)), 3);
        assert_eq!(ticks(Duration::MAX), u64::MAX);
    }
}
