//! Loading the dedupe component and calling it, with the host's store and handler
//! behind its imports.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use bq_dedupe_stores::AnyStore;
use wasmtime::component::{Component, HasSelf, Linker, ResourceAny};
use wasmtime::{Engine, Store};

use crate::handler::Handler;
use crate::keep_alive::HeldClaims;
use crate::wit::dedupe::Dedupe;
use crate::wit::dedupe::babelqueue::idempotency::types::{
    DeliveryReport, GuardOptions, KeyError, Options, Outcome, Processed, Rejection, StoreError,
};
use crate::wit::dedupe::exports::babelqueue::idempotency::consumer::GuestGuard;

/// What the component's imports reach: the store and the handler.
#[derive(Debug)]
pub struct HostState {
    /// The store behind the `store` import.
    pub store: AnyStore,
    /// The handler behind the `handler` import.
    pub handler: Handler,
    /// Claims the guest holds, kept alive from a thread while a handler runs.
    pub claims: HeldClaims,
    /// The run's spans, when it exports telemetry ([`crate::telemetry`]).
    pub spans: Option<crate::telemetry::Spans>,
    /// The envelopes (their hashes) whose handler succeeded during the call
    /// running now: if it traps, their retry may run them again, and says so.
    pub ran_ok: Vec<u64>,
}

impl HostState {
    /// `store` and `handler` behind the imports, nothing held or traced yet.
    pub fn new(store: AnyStore, handler: Handler) -> Self {
        HostState {
            store,
            handler,
            claims: HeldClaims::default(),
            spans: None,
            ran_ok: Vec::new(),
        }
    }
}

/// What [`HostState::ran_ok`] keeps of an envelope.
pub fn envelope_hash(envelope: &str) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault};
    BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default().hash_one(envelope)
}

/// The component built into this binary at compile time (empty if none was).
const BUILT_IN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/component.wasm"));

/// Which dedupe component to run.
#[derive(Debug, Clone)]
pub enum ComponentSource {
    /// A component file (`--component`, `$BQ_DEDUPE_COMPONENT`).
    File(PathBuf),
    /// The one built into the binary.
    BuiltIn,
}

impl ComponentSource {
    /// `--component`, else `$BQ_DEDUPE_COMPONENT`, else the built-in component,
    /// else the workspace build's path (whose absence is reported with the fix).
    pub fn choose(flag: Option<PathBuf>) -> Self {
        match flag.or_else(|| std::env::var_os("BQ_DEDUPE_COMPONENT").map(PathBuf::from)) {
            Some(path) => ComponentSource::File(path),
            None if !BUILT_IN.is_empty() => ComponentSource::BuiltIn,
            None => ComponentSource::File(
                Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../../target/component/bq_dedupe.component.wasm"),
            ),
        }
    }

    fn compile(&self, engine: &Engine) -> Result<Component> {
        match self {
            ComponentSource::BuiltIn => crate::compile_cache::component(engine, BUILT_IN)
                .map_err(anyhow::Error::from)
                .context("loading the built-in dedupe component"),
            ComponentSource::File(path) => (std::fs::read(path).map_err(anyhow::Error::from))
                .and_then(|wasm| {
                    crate::compile_cache::component(engine, &wasm).map_err(anyhow::Error::from)
                })
                .with_context(|| {
                    format!(
                        "loading the dedupe component {} (build it with scripts/build-component.sh)",
                        path.display()
                    )
                }),
        }
    }
}

/// The default component: see [`ComponentSource::choose`].
pub fn default_component() -> ComponentSource {
    ComponentSource::choose(None)
}

/// One instance of the dedupe component with its host state, and at most one
/// open `consumer.guard` resource (see [`Runtime::open_guard`]).
pub struct Runtime {
    component: Component,
    linker: Linker<HostState>,
    store: Store<HostState>,
    bindings: Dedupe,
    /// The open guard and the options it was constructed with (to construct it
    /// again in a fresh instance after a trap).
    guard: Option<(ResourceAny, GuardOptions)>,
    /// [`HostState::ran_ok`] of the last call, if it trapped.
    ran_before_trap: Vec<u64>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("state", self.store.data())
            .field("guard_open", &self.guard.is_some())
            .finish_non_exhaustive()
    }
}

impl Runtime {
    /// Compiles and instantiates the component from `source`, with `store` and
    /// `handler` behind its imports.
    pub fn load(source: &ComponentSource, store: AnyStore, handler: Handler) -> Result<Self> {
        let engine = crate::engine::engine();
        let component = source.compile(&engine)?;
        let mut linker = Linker::new(&engine);
        Dedupe::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |state| state)?;
        crate::handler::bind_lazily(&mut linker, &component)?;
        let state = HostState::new(store, handler);
        let mut store = Store::new(&engine, state);
        let instance = Dedupe::instantiate(&mut store, &component, &linker);
        // The cause first: an import this host does not give (the minimal
        // world's `seen-set`) read as "lacks an export" (a review's finding).
        let bindings = instance.map_err(|e| {
            anyhow::anyhow!(
                "the component does not fit this bq-dedupe: {e:#}. A host needs a component of \
                 the world `dedupe` (not `dedupe-minimal`) at least as new as itself: rebuild \
                 it with scripts/build-component.sh, or drop --component to use the built-in one"
            )
        })?;
        Ok(Runtime {
            component,
            linker,
            store,
            bindings,
            guard: None,
            ran_before_trap: Vec::new(),
        })
    }

    /// The host state: the store, the handler and the held claims.
    pub fn state(&mut self) -> &mut HostState {
        self.store.data_mut()
    }

    /// A trap leaves the instance unusable, and with it the whole wasmtime
    /// `Store` (the component model forbids entering it again): move the host
    /// state (the store connection, the handler, the held claims) into a fresh
    /// `Store` with a fresh instance. The call that trapped is still an error:
    /// its caller reports those deliveries as failed (retried), never as done.
    ///
    /// Every call ends here, and no claim outlives the call that took it: the
    /// guest settled, released or gave up each one. One it gave up (lost by its
    /// own clock while the store failed) or a trap left behind would otherwise
    /// be renewed while later handlers run, its message parked for as long as
    /// this run lives.
    fn recover<T>(&mut self, result: wasmtime::Result<T>) -> Result<T> {
        self.state().claims = HeldClaims::default();
        let ran_ok = std::mem::take(&mut self.state().ran_ok);
        self.ran_before_trap.clear();
        if result.is_err() {
            self.ran_before_trap = ran_ok;
            self.reinstantiate()
                .context("re-instantiating the component after a trap")?;
        }
        result
            .map_err(anyhow::Error::from)
            .context("the dedupe component trapped")
    }

    fn reinstantiate(&mut self) -> Result<()> {
        let engine = self.component.engine().clone();
        let stand_in = HostState::new(
            AnyStore::Memory(bq_dedupe::InMemoryStore::new()),
            Handler::Mark,
        );
        let trapped = std::mem::replace(&mut self.store, Store::new(&engine, stand_in));
        self.store = Store::new(&engine, trapped.into_data());
        self.bindings = Dedupe::instantiate(&mut self.store, &self.component, &self.linker)?;
        // The guard lived in the trapped instance: construct it again, with the
        // options it had (they were accepted once, so a refusal now is an error).
        if let Some((_, options)) = self.guard.take() {
            let resource = self.construct_guard(&options)?.map_err(|e| {
                anyhow::anyhow!("the guard's options were refused again: {}", e.message)
            })?;
            self.guard = Some((resource, options));
        }
        Ok(())
    }

    fn construct_guard(
        &mut self,
        options: &GuardOptions,
    ) -> wasmtime::Result<Result<ResourceAny, StoreError>> {
        self.bindings
            .babelqueue_idempotency_consumer()
            .guard()
            .call_constructor(&mut self.store, options)
    }

    /// Constructs the `consumer.guard` resource (1.1.0) the `guard_*` calls use,
    /// in place of any guard opened before: its options are checked and the
    /// store's capabilities read once, here. `Ok(Err(e))`: the options were
    /// refused (an invalid `key-scope`: `invalid`; fingerprints in a component
    /// built without them: `unsupported`).
    pub fn open_guard(&mut self, options: &GuardOptions) -> Result<Result<(), StoreError>> {
        if let Some((old, _)) = self.guard.take() {
            let dropped = old.resource_drop(&mut self.store);
            self.recover(dropped)?;
        }
        let r = self.construct_guard(options);
        Ok(self.recover(r)?.map(|resource| {
            self.guard = Some((resource, options.clone()));
        }))
    }

    /// The open guard, or an error saying [`Runtime::open_guard`] comes first.
    fn open(&self) -> Result<ResourceAny> {
        self.guard
            .as_ref()
            .map(|(resource, _)| *resource)
            .context("no guard is open: call Runtime::open_guard first")
    }

    /// Calls a method of the open guard, recovering the instance if it traps.
    fn on_guard<T>(
        &mut self,
        call: impl FnOnce(GuestGuard, &mut Store<HostState>, ResourceAny) -> wasmtime::Result<T>,
    ) -> Result<T> {
        let guard = self.open()?;
        let consumer = self.bindings.babelqueue_idempotency_consumer();
        let r = call(consumer.guard(), &mut self.store, guard);
        self.recover(r)
    }

    /// Whether `envelope`'s handler had succeeded in the last call before it
    /// trapped (its success may not have been recorded).
    pub fn ran_before_trap(&self, envelope: &str) -> bool {
        self.ran_before_trap.contains(&envelope_hash(envelope))
    }

    /// `consumer.guard.process` on the open guard.
    pub fn guard_process(&mut self, envelope: &str) -> Result<Outcome> {
        self.on_guard(|g, store, guard| g.call_process(store, guard, envelope))
    }

    /// `consumer.guard.process-batch` on the open guard.
    pub fn guard_process_batch(&mut self, envelopes: &[String]) -> Result<Vec<Outcome>> {
        self.on_guard(|g, store, guard| g.call_process_batch(store, guard, envelopes))
    }

    /// `consumer.guard.process-batch-ids` on the open guard: each outcome with
    /// its delivery's `meta.id`.
    pub fn guard_process_batch_ids(&mut self, envelopes: &[String]) -> Result<Vec<Processed>> {
        self.on_guard(|g, store, guard| g.call_process_batch_ids(store, guard, envelopes))
    }

    /// `consumer.guard.process-batch-reports` on the open guard: each outcome
    /// with its `meta.id` and what its span reports (duplicate, claimed).
    pub fn guard_process_batch_reports(
        &mut self,
        envelopes: &[String],
    ) -> Result<Vec<DeliveryReport>> {
        self.on_guard(|g, store, guard| g.call_process_batch_reports(store, guard, envelopes))
    }

    /// `consumer.guard.forget` on the open guard.
    pub fn guard_forget(&mut self, id: &str) -> Result<Result<(), StoreError>> {
        self.on_guard(|g, store, guard| g.call_forget(store, guard, id))
    }

    /// `consumer.process`: one delivery through the guard with `options`.
    pub fn process(&mut self, envelope: &str, options: &Options) -> Result<Outcome> {
        let r = self
            .bindings
            .babelqueue_idempotency_consumer()
            .call_process(&mut self.store, envelope, options);
        self.recover(r)
    }

    /// `consumer.process-batch`: a batch through the guard with `options`.
    pub fn process_batch(
        &mut self,
        envelopes: &[String],
        options: &Options,
    ) -> Result<Vec<Outcome>> {
        let r = self
            .bindings
            .babelqueue_idempotency_consumer()
            .call_process_batch(&mut self.store, envelopes, options);
        self.recover(r)
    }

    /// `consumer.process-batch-ids`: each outcome with its delivery's `meta.id`.
    pub fn process_batch_ids(
        &mut self,
        envelopes: &[String],
        options: &Options,
    ) -> Result<Vec<Processed>> {
        let r = self
            .bindings
            .babelqueue_idempotency_consumer()
            .call_process_batch_ids(&mut self.store, envelopes, options);
        self.recover(r)
    }

    /// `guard.dedupe-key-checked`: an invalid `key-scope` is a typed error.
    pub fn dedupe_key_checked(
        &mut self,
        envelope: &str,
        options: &Options,
    ) -> Result<Result<Option<String>, KeyError>> {
        let r = self
            .bindings
            .babelqueue_idempotency_guard()
            .call_dedupe_key_checked(&mut self.store, envelope, options);
        self.recover(r)
    }

    /// `consumer.forget`: the next delivery of `id` runs again.
    pub fn forget(&mut self, id: &str, options: &Options) -> Result<Result<(), StoreError>> {
        let r = self.bindings.babelqueue_idempotency_consumer().call_forget(
            &mut self.store,
            id,
            options,
        );
        self.recover(r)
    }

    /// `guard.dedupe-key`: the store key a delivery would be deduped under (an
    /// invalid `key-scope` traps: see [`Runtime::dedupe_key_checked`]).
    pub fn dedupe_key(
        &mut self,
        envelope: &str,
        options: &Options,
    ) -> Result<Result<Option<String>, Rejection>> {
        let r = self
            .bindings
            .babelqueue_idempotency_guard()
            .call_dedupe_key(&mut self.store, envelope, options);
        self.recover(r)
    }

    /// `guard.decode`: the envelope validated and re-serialized as canonical JSON.
    pub fn decode(&mut self, envelope: &str) -> Result<Result<String, Rejection>> {
        let r = self
            .bindings
            .babelqueue_idempotency_guard()
            .call_decode(&mut self.store, envelope);
        self.recover(r)
    }
}

/// Guard options with everything off but a key prefix.
pub fn guard_options(prefix: &str) -> GuardOptions {
    GuardOptions {
        ttl_ms: None,
        claim_lease_ms: None,
        key_prefix: prefix.to_owned(),
        key_scope: None,
        max_bytes: None,
        fingerprint: false,
    }
}

/// Options with everything off but a key prefix.
pub fn options(prefix: &str) -> Options {
    Options {
        ttl_ms: None,
        claim_lease_ms: None,
        key_prefix: prefix.to_owned(),
        key_scope: None,
        max_bytes: None,
    }
}
