//! The WIT contract in `wit/` parses, has the shape the hosts are promised, is
//! documented throughout, and agrees with the Rust core's stable codes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use bq_dedupe::{Disposition, OutcomeKind, envelope::Rejection, store::StoreErrorKind};
use wit_parser::{
    Docs, FunctionKind, Handle, InterfaceId, PackageId, Resolve, Type, TypeDefKind, TypeOwner,
    WorldItem, WorldKey,
};

/// Every Rust `OutcomeKind`. The exhaustive `match` in `outcome_kind_index` makes
/// adding a variant a compile error here until this list (and the WIT) follow.
const ALL_OUTCOME_KINDS: [OutcomeKind; 12] = [
    OutcomeKind::Ran,
    OutcomeKind::RanUnrecorded,
    OutcomeKind::Failed,
    OutcomeKind::Panicked,
    OutcomeKind::Skipped,
    OutcomeKind::FailOpen,
    OutcomeKind::FailOpenFailed,
    OutcomeKind::Parked,
    OutcomeKind::Rejected,
    OutcomeKind::StoreUnavailable,
    OutcomeKind::RanLeaseLost,
    OutcomeKind::PayloadMismatch,
];

fn outcome_kind_index(kind: OutcomeKind) -> usize {
    match kind {
        OutcomeKind::Ran => 0,
        OutcomeKind::RanUnrecorded => 1,
        OutcomeKind::Failed => 2,
        OutcomeKind::Panicked => 3,
        OutcomeKind::Skipped => 4,
        OutcomeKind::FailOpen => 5,
        OutcomeKind::FailOpenFailed => 6,
        OutcomeKind::Parked => 7,
        OutcomeKind::Rejected => 8,
        OutcomeKind::StoreUnavailable => 9,
        OutcomeKind::RanLeaseLost => 10,
        OutcomeKind::PayloadMismatch => 11,
    }
}

/// One value of every Rust `Rejection` variant. `Rejection` is `#[non_exhaustive]`,
/// so unlike `OutcomeKind` the compiler cannot prove this list complete.
fn all_rejections() -> Vec<Rejection> {
    vec![
        Rejection::NotJson("expected value at line 1 column 1".into()),
        Rejection::NotAnObject,
        Rejection::TooLarge {
            size: 2_000_000,
            limit: 1 << 20,
        },
        Rejection::TooDeep { limit: 128 },
        Rejection::MissingJob,
        Rejection::MetaNotObject,
        Rejection::UnsupportedSchemaVersion { found: "2".into() },
        Rejection::DataNotObject {
            found: "null".into(),
        },
        Rejection::BlankTraceId,
        Rejection::BadAttempts { found: "-1".into() },
    ]
}

const ALL_STORE_ERROR_KINDS: [StoreErrorKind; 4] = [
    StoreErrorKind::Unavailable,
    StoreErrorKind::Unsupported,
    StoreErrorKind::Invalid,
    StoreErrorKind::Internal,
];

fn store_error_kind_index(kind: StoreErrorKind) -> usize {
    match kind {
        StoreErrorKind::Unavailable => 0,
        StoreErrorKind::Unsupported => 1,
        StoreErrorKind::Invalid => 2,
        StoreErrorKind::Internal => 3,
    }
}

struct Contract {
    resolve: Resolve,
    package: PackageId,
}

fn load() -> Contract {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("wit");
    let mut resolve = Resolve::new();
    let (package, _sources) = resolve
        .push_dir(&dir)
        .unwrap_or_else(|e| panic!("wit/ does not parse: {e:?}"));
    Contract { resolve, package }
}

impl Contract {
    fn interface(&self, name: &str) -> InterfaceId {
        *self.resolve.packages[self.package]
            .interfaces
            .get(name)
            .unwrap_or_else(|| panic!("no interface `{name}` in the package"))
    }

    fn interface_name(&self, id: InterfaceId) -> String {
        self.resolve.interfaces[id]
            .name
            .clone()
            .unwrap_or_else(|| "<anonymous>".into())
    }

    /// A world's imports or exports, by interface name.
    fn world_items<'a>(
        &self,
        items: impl IntoIterator<Item = (&'a WorldKey, &'a WorldItem)>,
    ) -> BTreeSet<String> {
        items
            .into_iter()
            .map(|(key, item)| match (key, item) {
                (WorldKey::Interface(_), WorldItem::Interface { id, .. }) => {
                    self.interface_name(*id)
                }
                (key, item) => panic!(
                    "world item `{}` is not an interface: {item:?}",
                    self.resolve.name_world_key(key)
                ),
            })
            .collect()
    }

    /// The named type `name` defined in `types`.
    fn types_def(&self, name: &str) -> &wit_parser::TypeDef {
        let iface = self.interface("types");
        let id = self.resolve.interfaces[iface].types[name];
        &self.resolve.types[id]
    }

    fn variant_cases(&self, name: &str) -> Vec<String> {
        match &self.types_def(name).kind {
            TypeDefKind::Variant(v) => v.cases.iter().map(|c| c.name.clone()).collect(),
            other => panic!("`{name}` is not a variant: {other:?}"),
        }
    }

    fn enum_cases(&self, name: &str) -> Vec<String> {
        match &self.types_def(name).kind {
            TypeDefKind::Enum(e) => e.cases.iter().map(|c| c.name.clone()).collect(),
            other => panic!("`{name}` is not an enum: {other:?}"),
        }
    }

    /// A type in WIT syntax.
    fn render(&self, ty: &Type) -> String {
        match ty {
            Type::Bool => "bool".into(),
            Type::U8 => "u8".into(),
            Type::U16 => "u16".into(),
            Type::U32 => "u32".into(),
            Type::U64 => "u64".into(),
            Type::S8 => "s8".into(),
            Type::S16 => "s16".into(),
            Type::S32 => "s32".into(),
            Type::S64 => "s64".into(),
            Type::F32 => "f32".into(),
            Type::F64 => "f64".into(),
            Type::Char => "char".into(),
            Type::String => "string".into(),
            Type::ErrorContext => "error-context".into(),
            Type::Id(id) => {
                let def = &self.resolve.types[*id];
                if let Some(name) = &def.name {
                    return name.clone();
                }
                match &def.kind {
                    TypeDefKind::Option(t) => format!("option<{}>", self.render(t)),
                    TypeDefKind::List(t) => format!("list<{}>", self.render(t)),
                    TypeDefKind::Tuple(t) => format!(
                        "tuple<{}>",
                        t.types
                            .iter()
                            .map(|t| self.render(t))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    TypeDefKind::Result(r) => match (&r.ok, &r.err) {
                        (None, None) => "result".into(),
                        (ok, None) => format!("result<{}>", self.render_opt(ok)),
                        (ok, Some(err)) => {
                            format!("result<{}, {}>", self.render_opt(ok), self.render(err))
                        }
                    },
                    TypeDefKind::Type(t) => self.render(t),
                    TypeDefKind::Handle(Handle::Borrow(r)) => {
                        format!("borrow<{}>", self.render(&Type::Id(*r)))
                    }
                    TypeDefKind::Handle(Handle::Own(r)) => self.render(&Type::Id(*r)),
                    other => panic!("unexpected anonymous type {other:?}"),
                }
            }
        }
    }

    fn render_opt(&self, ty: &Option<Type>) -> String {
        ty.as_ref().map_or("_".into(), |t| self.render(t))
    }

    /// A named type definition in WIT syntax (`use` aliases as `= target`).
    fn render_def(&self, def: &wit_parser::TypeDef) -> String {
        let name = def.name.as_deref().unwrap_or("<anonymous>");
        match &def.kind {
            TypeDefKind::Record(r) => format!(
                "record {name} {{ {} }}",
                r.fields
                    .iter()
                    .map(|f| format!("{}: {}", f.name, self.render(&f.ty)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            TypeDefKind::Variant(v) => format!(
                "variant {name} {{ {} }}",
                v.cases
                    .iter()
                    .map(|c| match &c.ty {
                        Some(t) => format!("{}({})", c.name, self.render(t)),
                        None => c.name.clone(),
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            TypeDefKind::Enum(e) => format!(
                "enum {name} {{ {} }}",
                e.cases
                    .iter()
                    .map(|c| c.name.clone())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            TypeDefKind::Type(t) => format!("type {name} = {}", self.render(t)),
            TypeDefKind::Resource => format!("resource {name}"),
            other => panic!("unexpected type definition {other:?}"),
        }
    }

    /// An interface's functions in WIT syntax, by name.
    fn signatures(&self, iface: &str) -> BTreeMap<String, String> {
        let id = self.interface(iface);
        self.resolve.interfaces[id]
            .functions
            .values()
            .map(|f| {
                let params = f
                    .params
                    .iter()
                    .map(|p| format!("{}: {}", p.name, self.render(&p.ty)))
                    .collect::<Vec<_>>()
                    .join(", ");
                let ret = f
                    .result
                    .as_ref()
                    .map_or(String::new(), |t| format!(" -> {}", self.render(t)));
                (f.name.clone(), format!("func({params}){ret}"))
            })
            .collect()
    }

    /// An interface's type definitions (and `use` aliases) in WIT syntax, by name.
    fn type_defs(&self, iface: &str) -> BTreeMap<String, String> {
        let id = self.interface(iface);
        self.resolve.interfaces[id]
            .types
            .iter()
            .map(|(name, id)| (name.clone(), self.render_def(&self.resolve.types[*id])))
            .collect()
    }

    /// Is `id` a `use` alias of a type defined in the `types` interface? `use`
    /// statements cannot carry docs; the type they name must.
    fn is_use_of_types(&self, id: wit_parser::TypeId) -> bool {
        let types = self.interface("types");
        let def = &self.resolve.types[id];
        match (&def.kind, def.owner) {
            (TypeDefKind::Type(Type::Id(target)), TypeOwner::Interface(owner)) => {
                owner != types && self.resolve.types[*target].owner == TypeOwner::Interface(types)
            }
            _ => false,
        }
    }
}

fn documented(docs: &Docs) -> bool {
    docs.contents
        .as_deref()
        .is_some_and(|text| !text.trim().is_empty())
}

fn names(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn sigs(items: &[(&str, &str)]) -> BTreeMap<String, String> {
    items
        .iter()
        .map(|(name, sig)| (name.to_string(), sig.to_string()))
        .collect()
}

#[test]
fn package_is_babelqueue_idempotency_1_1_0_and_self_contained() {
    let c = load();
    let package = &c.resolve.packages[c.package];
    assert_eq!(package.name.namespace, "babelqueue");
    assert_eq!(package.name.name, "idempotency");
    assert_eq!(
        package.name.version.as_ref().map(|v| v.to_string()),
        Some("1.1.0".to_string())
    );
    assert_eq!(package.name.to_string(), "babelqueue:idempotency@1.1.0");

    // No dependencies at all, so in particular no WASI.
    assert_eq!(
        c.resolve.packages.len(),
        1,
        "the contract must not pull in other packages (WASI or otherwise)"
    );
    assert_eq!(
        package.interfaces.keys().cloned().collect::<BTreeSet<_>>(),
        names(&[
            "types", "store", "leases", "seen-set", "handler", "guard", "consumer"
        ])
    );
    assert_eq!(
        package.worlds.keys().cloned().collect::<BTreeSet<_>>(),
        names(&[
            "dedupe-guard",
            "dedupe-consumer",
            "dedupe",
            "dedupe-minimal",
            "handler-plugin"
        ])
    );
}

#[test]
fn worlds_import_and_export_exactly_the_contracted_interfaces() {
    let c = load();
    let package = &c.resolve.packages[c.package];
    // `types` holds only types; it is imported implicitly wherever an imported or
    // exported interface `use`s it, and is the only import beyond the listed ones.
    let expected: [(&str, &[&str], &[&str]); 5] = [
        ("dedupe-guard", &["types", "store", "leases"], &["guard"]),
        (
            "dedupe-consumer",
            &["types", "store", "leases", "handler"],
            &["consumer"],
        ),
        // The shipped component: both guards, one import set.
        (
            "dedupe",
            &["types", "store", "leases", "handler"],
            &["guard", "consumer"],
        ),
        // The shipped minimal component: both guards over a seen-set alone.
        (
            "dedupe-minimal",
            &["types", "seen-set", "handler"],
            &["guard", "consumer"],
        ),
        ("handler-plugin", &[], &["handler"]),
    ];
    for (world, imports, exports) in expected {
        let id = package.worlds[world];
        let w = &c.resolve.worlds[id];
        assert_eq!(
            c.world_items(&w.imports),
            names(imports),
            "imports of world `{world}`"
        );
        assert_eq!(
            c.world_items(&w.exports),
            names(exports),
            "exports of world `{world}`"
        );
    }
    let types = c.interface("types");
    assert!(
        c.resolve.interfaces[types].functions.is_empty(),
        "`types` must stay function-free, since worlds import it implicitly"
    );
}

#[test]
fn store_interface_has_exactly_the_ten_functions() {
    let c = load();
    let store = c.interface("store");
    let functions: BTreeSet<String> = c.resolve.interfaces[store]
        .functions
        .keys()
        .cloned()
        .collect();
    assert_eq!(
        functions,
        names(&[
            "capabilities",
            "seen",
            "remember",
            "forget",
            "seen-many",
            "remember-many",
            "claim",
            "claim-many",
            "release",
            "commit-many",
        ])
    );
}

#[test]
fn function_signatures_match_the_contract() {
    let c = load();
    // `claim` and `capabilities` are both functions and types in `store`, and an
    // interface's names must be unique, so `store` imports the types renamed.
    assert_eq!(
        c.signatures("store"),
        sigs(&[
            ("capabilities", "func() -> store-capabilities"),
            ("seen", "func(key: string) -> result<bool, store-error>"),
            (
                "remember",
                "func(key: string, ttl-ms: option<u64>) -> result<_, store-error>"
            ),
            ("forget", "func(key: string) -> result<_, store-error>"),
            (
                "seen-many",
                "func(keys: list<string>) -> result<list<bool>, store-error>"
            ),
            (
                "remember-many",
                "func(keys: list<string>, ttl-ms: option<u64>) -> result<_, store-error>"
            ),
            (
                "claim",
                "func(key: string, lease-ms: u64) -> result<claim-answer, store-error>"
            ),
            (
                "claim-many",
                "func(keys: list<string>, lease-ms: u64) -> result<list<claim-answer>, store-error>"
            ),
            (
                "release",
                "func(key: string, token: string) -> result<_, store-error>"
            ),
            (
                "commit-many",
                "func(done: list<string>, ttl-ms: option<u64>, \
                 release: list<tuple<string, string>>) -> result<_, store-error>"
            ),
        ])
    );
    // 1.1.0: the seen-set alone is the store's first three functions, exactly.
    let store_sigs = c.signatures("store");
    assert_eq!(
        c.signatures("seen-set"),
        store_sigs
            .into_iter()
            .filter(|(name, _)| ["seen", "remember", "forget"].contains(&name.as_str()))
            .collect()
    );
    // 1.1.0: the lease functions live in their own interface, so every 1.0
    // function above is unchanged.
    assert_eq!(
        c.signatures("leases"),
        sigs(&[
            ("supported", "func() -> bool"),
            ("now-ms", "func() -> u64"),
            (
                "settle",
                "func(remember: list<tuple<string, option<string>>>, ttl-ms: option<u64>, \
                 release: list<tuple<string, string>>, renew: list<tuple<string, string>>, \
                 lease-ms: u64) -> result<settled, store-error>"
            ),
        ])
    );
    let aliases = c.type_defs("store");
    assert_eq!(
        aliases,
        sigs(&[
            ("store-error", "type store-error = store-error"),
            (
                "store-capabilities",
                "type store-capabilities = capabilities"
            ),
            ("claim-answer", "type claim-answer = claim"),
        ])
    );

    assert_eq!(
        c.signatures("handler"),
        sigs(&[("handle", "func(envelope: string) -> result<_, string>")])
    );

    assert_eq!(
        c.signatures("guard"),
        sigs(&[
            (
                "decide",
                "func(envelope: string, options: options) -> decision"
            ),
            (
                "decide-batch",
                "func(envelopes: list<string>, options: options) -> list<decision>"
            ),
            (
                "complete",
                "func(decision: decision, result: option<handler-result>, options: options) \
                 -> outcome"
            ),
            (
                "complete-batch",
                "func(decisions: list<decision>, results: list<option<handler-result>>, \
                 options: options) -> list<outcome>"
            ),
            (
                "forget",
                "func(id: string, options: options) -> result<_, store-error>"
            ),
            (
                "dedupe-key",
                "func(envelope: string, options: options) -> result<option<string>, rejection>"
            ),
            (
                "dedupe-key-checked",
                "func(envelope: string, options: options) -> result<option<string>, key-error>"
            ),
            (
                "decode",
                "func(envelope: string) -> result<string, rejection>"
            ),
        ])
    );

    assert_eq!(
        c.signatures("consumer"),
        sigs(&[
            (
                "process",
                "func(envelope: string, options: options) -> outcome"
            ),
            (
                "process-batch",
                "func(envelopes: list<string>, options: options) -> list<outcome>"
            ),
            (
                "process-batch-ids",
                "func(envelopes: list<string>, options: options) -> list<processed>"
            ),
            (
                "forget",
                "func(id: string, options: options) -> result<_, store-error>"
            ),
            // 1.1.0: the `guard` resource, options once, then only the bodies.
            (
                "[constructor]guard",
                "func(options: guard-options) -> result<guard, store-error>"
            ),
            (
                "[method]guard.process",
                "func(self: borrow<guard>, envelope: string) -> outcome"
            ),
            (
                "[method]guard.process-batch",
                "func(self: borrow<guard>, envelopes: list<string>) -> list<outcome>"
            ),
            (
                "[method]guard.process-batch-ids",
                "func(self: borrow<guard>, envelopes: list<string>) -> list<processed>"
            ),
            // Then each outcome with what its span reports (duplicate, claimed).
            (
                "[method]guard.process-batch-reports",
                "func(self: borrow<guard>, envelopes: list<string>) -> list<delivery-report>"
            ),
            (
                "[method]guard.forget",
                "func(self: borrow<guard>, id: string) -> result<_, store-error>"
            ),
        ])
    );
}

/// 1.1.0: `consumer` defines the `guard` resource (and only it), constructed
/// fallibly, with methods and no static functions.
#[test]
fn consumer_guard_is_a_resource_with_a_fallible_constructor() {
    let c = load();
    let consumer = c.interface("consumer");
    let iface = &c.resolve.interfaces[consumer];
    let defs = c.type_defs("consumer");
    assert_eq!(
        defs,
        sigs(&[
            ("options", "type options = options"),
            ("guard-options", "type guard-options = guard-options"),
            ("outcome", "type outcome = outcome"),
            ("store-error", "type store-error = store-error"),
            ("processed", "type processed = processed"),
            ("delivery-report", "type delivery-report = delivery-report"),
            ("guard", "resource guard"),
        ])
    );
    let guard = iface.types["guard"];
    let mut kinds: Vec<(String, &str)> = iface
        .functions
        .values()
        .filter_map(|f| match f.kind {
            FunctionKind::Constructor(r) if r == guard => Some((f.name.clone(), "constructor")),
            FunctionKind::Method(r) if r == guard => Some((f.name.clone(), "method")),
            FunctionKind::Freestanding => None,
            _ => Some((f.name.clone(), "other")),
        })
        .collect();
    kinds.sort();
    assert_eq!(
        kinds,
        [
            ("[constructor]guard".to_string(), "constructor"),
            ("[method]guard.forget".to_string(), "method"),
            ("[method]guard.process".to_string(), "method"),
            ("[method]guard.process-batch".to_string(), "method"),
            ("[method]guard.process-batch-ids".to_string(), "method"),
            ("[method]guard.process-batch-reports".to_string(), "method"),
        ]
    );
    // The guard's options are the 1.x options, field for field, plus fingerprints.
    let TypeDefKind::Record(options) = &c.types_def("options").kind else {
        panic!("`options` is not a record");
    };
    let TypeDefKind::Record(guard_options) = &c.types_def("guard-options").kind else {
        panic!("`guard-options` is not a record");
    };
    let fields = |r: &wit_parser::Record| -> Vec<(String, String)> {
        r.fields
            .iter()
            .map(|f| (f.name.clone(), c.render(&f.ty)))
            .collect()
    };
    let mut expected = fields(options);
    expected.push(("fingerprint".into(), "bool".into()));
    assert_eq!(fields(guard_options), expected);
}

#[test]
fn types_interface_matches_the_contract() {
    let c = load();
    let defs = c.type_defs("types");
    assert_eq!(
        defs,
        sigs(&[
            (
                "store-error-kind",
                "enum store-error-kind { unavailable, unsupported, invalid, internal }"
            ),
            (
                "store-error",
                "record store-error { kind: store-error-kind, message: string }"
            ),
            ("claim", "variant claim { acquired(string), seen, held }"),
            (
                "capabilities",
                "record capabilities { batch: bool, claim: bool, ttl: bool }"
            ),
            (
                "rejection-code",
                "enum rejection-code { not-json, not-an-object, too-large, too-deep, \
                 missing-job, meta-not-object, unsupported-schema-version, data-not-object, \
                 blank-trace-id, bad-attempts }"
            ),
            (
                "rejection",
                "record rejection { code: rejection-code, message: string }"
            ),
            (
                "options",
                "record options { ttl-ms: option<u64>, claim-lease-ms: option<u64>, \
                 key-prefix: string, key-scope: option<string>, max-bytes: option<u32> }"
            ),
            (
                "verdict",
                "variant verdict { run, fail-open, skip, park, duplicate(u32), \
                 reject(rejection), store-unavailable(store-error), payload-mismatch }"
            ),
            (
                "decision",
                "record decision { verdict: verdict, key: option<string>, \
                 claim-token: option<string> }"
            ),
            (
                "handler-result",
                "variant handler-result { ok, failed(string), panicked(string) }"
            ),
            (
                "outcome",
                "variant outcome { run-ok, run-ok-unrecorded(store-error), run-failed(string), \
                 run-panicked(string), skip, fail-open, fail-open-failed(string), park, \
                 rejected(rejection), store-unavailable(store-error), run-ok-lease-lost, \
                 payload-mismatch }"
            ),
            (
                "key-error",
                "variant key-error { rejected(rejection), invalid-options(store-error) }"
            ),
            (
                "processed",
                "record processed { id: option<string>, outcome: outcome }"
            ),
            (
                "delivery-report",
                "record delivery-report { id: option<string>, outcome: outcome, \
                 duplicate: bool, claimed: bool }"
            ),
            (
                "guard-options",
                "record guard-options { ttl-ms: option<u64>, claim-lease-ms: option<u64>, \
                 key-prefix: string, key-scope: option<string>, max-bytes: option<u32>, \
                 fingerprint: bool }"
            ),
        ])
    );
}

#[test]
fn every_item_is_documented() {
    let c = load();
    let mut missing = Vec::new();

    if !documented(&c.resolve.packages[c.package].docs) {
        missing.push("package".to_string());
    }
    for (_, iface) in c.resolve.interfaces.iter() {
        let name = iface.name.as_deref().unwrap_or("<anonymous>");
        if !documented(&iface.docs) {
            missing.push(format!("interface {name}"));
        }
        for f in iface.functions.values() {
            if !documented(&f.docs) {
                missing.push(format!("function {name}.{}", f.name));
            }
        }
    }
    for (_, world) in c.resolve.worlds.iter() {
        if !documented(&world.docs) {
            missing.push(format!("world {}", world.name));
        }
        // `types` is imported implicitly, so only the written statements have docs.
        for (dir, items) in [("import", &world.imports), ("export", &world.exports)] {
            for item in items.values() {
                match item {
                    WorldItem::Interface { id, docs, .. } => {
                        let iface = c.interface_name(*id);
                        if iface != "types" && !documented(docs) {
                            missing.push(format!("world {} {dir} {iface}", world.name));
                        }
                    }
                    WorldItem::Function(f) => {
                        if !documented(&f.docs) {
                            missing.push(format!("world {} {dir} func {}", world.name, f.name));
                        }
                    }
                    WorldItem::Type { id, .. } => {
                        if !documented(&c.resolve.types[*id].docs) {
                            missing.push(format!("world {} {dir} type", world.name));
                        }
                    }
                }
            }
        }
    }
    let mut named_types = 0;
    for (id, def) in c.resolve.types.iter() {
        // Anonymous types (`option<u64>`, `list<string>`, ...) cannot carry docs.
        let Some(name) = &def.name else { continue };
        named_types += 1;
        if !documented(&def.docs) && !c.is_use_of_types(id) {
            missing.push(format!("type {name}"));
        }
        match &def.kind {
            TypeDefKind::Record(r) => {
                for f in &r.fields {
                    if !documented(&f.docs) {
                        missing.push(format!("field {name}.{}", f.name));
                    }
                }
            }
            TypeDefKind::Variant(v) => {
                for case in &v.cases {
                    if !documented(&case.docs) {
                        missing.push(format!("case {name}.{}", case.name));
                    }
                }
            }
            TypeDefKind::Enum(e) => {
                for case in &e.cases {
                    if !documented(&case.docs) {
                        missing.push(format!("case {name}.{}", case.name));
                    }
                }
            }
            _ => {}
        }
    }
    assert!(named_types >= 11, "the walk found only {named_types} types");
    assert!(missing.is_empty(), "undocumented items: {missing:#?}");
}

#[test]
fn outcome_cases_are_the_rust_outcome_kind_codes_in_order() {
    let c = load();
    let cases = c.variant_cases("outcome");
    assert_eq!(
        cases,
        [
            "run-ok",
            "run-ok-unrecorded",
            "run-failed",
            "run-panicked",
            "skip",
            "fail-open",
            "fail-open-failed",
            "park",
            "rejected",
            "store-unavailable",
            // 1.1.0 appends its cases, so every 1.0 case keeps its place.
            "run-ok-lease-lost",
            "payload-mismatch",
        ]
    );

    let mut codes = BTreeSet::new();
    for kind in ALL_OUTCOME_KINDS {
        assert_eq!(ALL_OUTCOME_KINDS[outcome_kind_index(kind)], kind);
        assert!(
            cases.iter().any(|case| case == kind.code()),
            "Rust outcome code `{}` is not a case of the WIT `outcome`",
            kind.code()
        );
        codes.insert(kind.code().to_string());
    }
    assert_eq!(
        codes,
        cases.iter().cloned().collect::<BTreeSet<_>>(),
        "the WIT `outcome` has cases the Rust core never produces"
    );
}

#[test]
fn outcome_case_docs_state_the_rust_disposition() {
    let c = load();
    let TypeDefKind::Variant(outcome) = &c.types_def("outcome").kind else {
        panic!("`outcome` is not a variant");
    };
    for kind in ALL_OUTCOME_KINDS {
        let case = outcome
            .cases
            .iter()
            .find(|case| case.name == kind.code())
            .unwrap_or_else(|| panic!("no outcome case `{}`", kind.code()));
        let expected = match kind.disposition() {
            Disposition::Ack => "Ack.",
            Disposition::Retry => "Retry.",
            Disposition::Poison => "Poison.",
        };
        let docs = case.docs.contents.as_deref().unwrap_or("");
        assert!(
            docs.starts_with(expected),
            "the doc of outcome case `{}` must start with `{expected}`, found {docs:?}",
            case.name
        );
    }
}

#[test]
fn rejection_codes_are_the_rust_rejection_codes() {
    let c = load();
    let cases: BTreeSet<String> = c.enum_cases("rejection-code").into_iter().collect();
    let rejections = all_rejections();
    let codes: BTreeSet<String> = rejections.iter().map(|r| r.code().to_string()).collect();
    assert_eq!(
        codes.len(),
        rejections.len(),
        "two Rust rejections share a code"
    );
    assert_eq!(cases, codes);
}

#[test]
fn store_error_kinds_are_the_rust_store_error_kind_codes() {
    let c = load();
    let cases = c.enum_cases("store-error-kind");
    for kind in ALL_STORE_ERROR_KINDS {
        assert_eq!(ALL_STORE_ERROR_KINDS[store_error_kind_index(kind)], kind);
    }
    let codes: Vec<String> = ALL_STORE_ERROR_KINDS
        .iter()
        .map(|k| k.code().to_string())
        .collect();
    assert_eq!(cases, codes);
}
