//! Host-side bindings of the WIT package (`wit/`), one module per world.

/// The dedupe component: imports `store` and `handler`, exports `guard` and `consumer`.
pub mod dedupe {
    wasmtime::component::bindgen!({
        path: "wit",
        world: "dedupe",
        // Outcomes compare in tests and in hosts that match on them.
        additional_derives: [PartialEq],
    });
}

/// A handler plugin: exports `handler`.
pub mod plugin {
    wasmtime::component::bindgen!({ path: "wit", world: "handler-plugin" });
}
