//! Configuration from `wrangler.toml` `[vars]` (strings, or unquoted numbers and
//! booleans, read as their text): every `DEDUPE_*` setting, checked at start-up.
//! The table of settings is in `docs/workers.md` ("Settings"); what leases,
//! parking, resharding and the default window mean for an operator is in
//! `docs/workers-leases.md`.

use std::time::Duration;

use std::sync::Arc;

use bq_dedupe::{Guard, KeySpace};
use wasm_bindgen::JsValue;
use worker::Env;

use crate::consumer::{DEFAULT_PARK_DELAY_SECONDS, QueueConsumer};
use crate::d1::D1Store;
use crate::durable::DurableObjectStore;
use crate::kv::{self, KvStore};
use crate::round_trips::RoundTrips;
use crate::shard::Layout;
use crate::store::WorkersStore;
use crate::time::{JsClock, WorkersTimer};

/// The longest TTL or lease accepted: 100 years (expiry times stay exact in JS).
pub const MAX_SECONDS: u64 = 100 * 365 * 24 * 3600;
/// Cloudflare's longest retry delay: 12 hours.
pub const MAX_DELAY_SECONDS: u64 = 12 * 3600;
/// The longest a Queues message is retained: 14 days.
pub const MAX_RETENTION_SECONDS: u64 = 14 * 24 * 3600;
/// The default dedupe window: every redelivery Cloudflare can make (the longest
/// retention plus the longest retry delay), 1,252,800 s.
pub const DEFAULT_TTL: Duration = Duration::from_secs(MAX_RETENTION_SECONDS + MAX_DELAY_SECONDS);

/// Every `DEDUPE_*` setting (`docs/workers.md`, "Settings"). A var of another
/// `DEDUPE_*` name is refused as a misspelling, which would otherwise be
/// ignored (`DEDUPE_TTL_SECOND` leaving the default window).
pub const SETTINGS: &[&str] = &[
    "DEDUPE_STORE",
    "DEDUPE_CLAIMING",
    "DEDUPE_CLAIM_LEASE_SECONDS",
    "DEDUPE_FINGERPRINT",
    "DEDUPE_TTL_SECONDS",
    "DEDUPE_SHARDS",
    "DEDUPE_PREVIOUS_SHARDS",
    "DEDUPE_KEY_PREFIX",
    "DEDUPE_DEAD_LETTER",
    "DEDUPE_MAX_RETRIES",
    "DEDUPE_RETRY_DELAY_SECONDS",
    "DEDUPE_PARK_DELAY_SECONDS",
    "DEDUPE_DO_BINDING",
    "DEDUPE_KV_BINDING",
    "DEDUPE_D1_BINDING",
];

/// Cloudflare's `max_retries` when a queue sets none.
pub const DEFAULT_MAX_RETRIES: u32 = 3;

/// A message parked behind a claim waits just past the claim's end (at most
/// 12 h per retry, Cloudflare's longest delay). Behind the claim of a consumer
/// that died, it must still have a retry left once that claim has lapsed:
/// refused unless `max_retries` retries of 12 h outlast the lease, and the
/// lease is shorter than the longest a queue retains a message (14 days; the
/// queue's own retention, 4 days by default, cannot be read here: documented).
fn check_parks_outlast_a_lease(lease: u64, max_retries: Option<u32>) -> Result<(), ConfigError> {
    if lease >= MAX_RETENTION_SECONDS {
        return Err(ConfigError(format!(
            "DEDUPE_CLAIM_LEASE_SECONDS={lease}: a message parked behind the claim of a \
             consumer that died waits until the claim lapses, and no queue keeps a message \
             that long ({MAX_RETENTION_SECONDS} s at most, 4 days by default): it would be \
             deleted without running; keep the lease under the queue's \
             message_retention_period"
        )));
    }
    let retries = max_retries.unwrap_or(DEFAULT_MAX_RETRIES);
    let can_wait = u64::from(retries) * MAX_DELAY_SECONDS;
    if can_wait >= lease {
        return Ok(());
    }
    let retries = match max_retries {
        Some(n) => format!("DEDUPE_MAX_RETRIES={n}"),
        None => format!("the queue's default max_retries ({DEFAULT_MAX_RETRIES})"),
    };
    let waits = match can_wait {
        0 => "has no retry to wait with".to_owned(),
        _ => format!("waits at most {can_wait} s ({MAX_DELAY_SECONDS} s per retry)"),
    };
    Err(ConfigError(format!(
        "DEDUPE_CLAIM_LEASE_SECONDS={lease} with {retries}: a message parked behind the claim \
         of a consumer that died {waits}, so it would run out of retries before the claim \
         lapses; shorten the lease, raise max_retries (and DEDUPE_MAX_RETRIES with it), or \
         set DEDUPE_CLAIMING=off"
    )))
}

/// A var's text: strings as they are, numbers and booleans written without quotes
/// in wrangler.toml as their JSON text, anything else as JSON (so the parse error
/// shows it). `None` when the var is not set.
fn var_text(env: &Env, name: &str) -> Option<String> {
    let value = js_sys::Reflect::get(env, &JsValue::from_str(name)).ok()?;
    if value.is_undefined() || value.is_null() {
        return None;
    }
    if let Some(text) = value.as_string() {
        return Some(text);
    }
    js_sys::JSON::stringify(&value)
        .ok()
        .and_then(|json| json.as_string())
}

/// The first var named `DEDUPE_*` (in any case, or `DEDUP_*`) that is no
/// setting, in `env` or in the
/// objects it is laid over (the TypeScript options are laid over the env).
/// Bindings are objects, not vars, and are left alone.
fn unknown_setting(env: &Env) -> Option<String> {
    use wasm_bindgen::JsCast;
    let mut layer: JsValue = JsValue::from(env.clone());
    while layer.is_object() {
        let object: &js_sys::Object = layer.unchecked_ref();
        for key in js_sys::Object::keys(object).iter() {
            let name = key.as_string().unwrap_or_default();
            // Ours in any case, or one letter short (`dedupe_store`,
            // `DEDUP_CLAIMING` were ignored: a trial).
            let upper = name.to_ascii_uppercase();
            let ours = upper.starts_with("DEDUPE_") || upper.starts_with("DEDUP_");
            if !ours || SETTINGS.contains(&name.as_str()) {
                continue;
            }
            let value = js_sys::Reflect::get(object, &key).unwrap_or_default();
            if value.is_string() || value.as_f64().is_some() || value.as_bool().is_some() {
                return Some(name);
            }
        }
        layer = js_sys::Object::get_prototype_of(&layer).into();
    }
    None
}

/// Where the ids are kept (`DEDUPE_STORE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    /// Strongly consistent, can claim: the default.
    DurableObject,
    /// Eventually consistent, cannot claim: best effort.
    Kv,
    /// A D1 database: atomic claims, and the transactional mode (the handler's
    /// statements committed with the id).
    D1,
}

/// A configuration mistake, named after the var or binding to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bq-dedupe configuration: {0}")]
pub struct ConfigError(pub String);

impl From<ConfigError> for worker::Error {
    fn from(e: ConfigError) -> Self {
        worker::Error::RustError(e.to_string())
    }
}

/// The `DEDUPE_*` vars, parsed and checked (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct DedupeConfig {
    /// `DEDUPE_STORE`.
    pub store: StoreKind,
    /// How long an id counts as seen (`DEDUPE_TTL_SECONDS`; `None`: forever).
    pub ttl: Option<Duration>,
    /// Durable Objects the ids are spread over (`DEDUPE_SHARDS`).
    pub shards: u32,
    /// While resharding: the layout before the change (`DEDUPE_PREVIOUS_SHARDS`).
    pub previous_layout: Option<Layout>,
    /// The ids' namespace (`DEDUPE_KEY_PREFIX`).
    pub key_prefix: String,
    /// `Some(lease)`: claiming on.
    pub claim_lease: Option<Duration>,
    /// Payload fingerprints (`DEDUPE_FINGERPRINT`).
    pub fingerprint: bool,
    /// Delay for retried messages (`DEDUPE_RETRY_DELAY_SECONDS`).
    pub retry_delay_seconds: Option<u32>,
    /// Delay for a parked message when the store cannot say how long the claim
    /// has left (`DEDUPE_PARK_DELAY_SECONDS`).
    pub park_delay_seconds: u32,
    /// The queue's `max_retries` (`DEDUPE_MAX_RETRIES`).
    pub max_retries: Option<u32>,
    /// The queue producer binding for poison messages (`DEDUPE_DEAD_LETTER`).
    pub dead_letter_binding: Option<String>,
    /// The `DedupeShard` Durable Object binding (`DEDUPE_DO_BINDING`).
    pub durable_object_binding: String,
    /// The KV namespace binding (`DEDUPE_KV_BINDING`).
    pub kv_binding: String,
    /// The D1 database binding (`DEDUPE_D1_BINDING`).
    pub d1_binding: String,
}

impl DedupeConfig {
    /// Reads the `DEDUPE_*` vars (see the module docs). A var written without
    /// quotes in wrangler.toml (a number or boolean) counts as its text.
    pub fn from_env(env: &Env) -> Result<Self, ConfigError> {
        if let Some(name) = unknown_setting(env) {
            return Err(ConfigError(format!(
                "{name} is no setting (misspelt? it would be ignored); the settings are {}",
                SETTINGS.join(", ")
            )));
        }
        Self::from_vars(|name| var_text(env, name))
    }

    /// The same from any lookup (tests, other sources).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let get = |name: &str| {
            debug_assert!(SETTINGS.contains(&name), "{name} is missing from SETTINGS");
            var(name)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        // A whole number in `min..=max`, or `None` when unset.
        let number = |name: &str, min: u64, max: u64| -> Result<Option<u64>, ConfigError> {
            let Some(text) = get(name) else {
                return Ok(None);
            };
            match text.parse::<u64>() {
                Ok(n) if (min..=max).contains(&n) => Ok(Some(n)),
                _ => Err(ConfigError(format!(
                    "{name} must be a whole number in {min}..={max}, got {text:?}"
                ))),
            }
        };
        let store = match get("DEDUPE_STORE").as_deref() {
            None | Some("durable-object") => StoreKind::DurableObject,
            Some("kv") => StoreKind::Kv,
            Some("d1") => StoreKind::D1,
            Some(other) => {
                return Err(ConfigError(format!(
                    "DEDUPE_STORE must be \"durable-object\", \"kv\" or \"d1\", got {other:?}"
                )));
            }
        };
        let claiming = match get("DEDUPE_CLAIMING").as_deref() {
            None => store != StoreKind::Kv,
            Some("on" | "true") => true,
            Some("off" | "false") => false,
            Some(other) => {
                return Err(ConfigError(format!(
                    "DEDUPE_CLAIMING must be \"on\" or \"off\", got {other:?}"
                )));
            }
        };
        let fingerprint = match get("DEDUPE_FINGERPRINT").as_deref() {
            None | Some("off" | "false") => false,
            Some("on" | "true") => true,
            Some(other) => {
                return Err(ConfigError(format!(
                    "DEDUPE_FINGERPRINT must be \"on\" or \"off\", got {other:?}"
                )));
            }
        };
        if claiming && store == StoreKind::Kv {
            return Err(ConfigError(
                "DEDUPE_CLAIMING=on needs DEDUPE_STORE=durable-object or d1: Workers KV has \
                 no atomic operation to claim with"
                    .into(),
            ));
        }
        // Unset: the default window; `forever` or 0: remembered until forgotten.
        let ttl = match get("DEDUPE_TTL_SECONDS").as_deref() {
            Some("forever") => None,
            _ => match number("DEDUPE_TTL_SECONDS", 0, MAX_SECONDS)? {
                None => Some(DEFAULT_TTL),
                Some(0) => None,
                Some(s) => Some(Duration::from_secs(s)),
            },
        };
        if store == StoreKind::Kv {
            kv::check_ttl(ttl)
                .map_err(|e| ConfigError(format!("DEDUPE_TTL_SECONDS: {}", e.message)))?;
        }
        let shards = number("DEDUPE_SHARDS", 1, 1024)?.unwrap_or(1);
        let previous_layout = match get("DEDUPE_PREVIOUS_SHARDS") {
            None => None,
            Some(text) => {
                let (legacy, count) = match text.strip_prefix("sha256-mod:") {
                    Some(count) => (true, count.trim()),
                    None => (false, text.as_str()),
                };
                match count.parse::<u32>() {
                    Ok(n @ 1..=1024) if legacy => Some(Layout::Sha256Mod(n)),
                    Ok(n @ 1..=1024) => Some(Layout::Jump(n)),
                    _ => {
                        return Err(ConfigError(format!(
                            "DEDUPE_PREVIOUS_SHARDS must be the shard count before the change \
                             (1..=1024), or sha256-mod:N for objects of a version before jump \
                             hashing, got {text:?}"
                        )));
                    }
                }
            }
        };
        if previous_layout.is_some() && store != StoreKind::DurableObject {
            return Err(ConfigError(
                "DEDUPE_PREVIOUS_SHARDS is for the Durable Object store: KV and D1 are not sharded"
                    .into(),
            ));
        }
        let lease = number("DEDUPE_CLAIM_LEASE_SECONDS", 1, MAX_SECONDS)?.unwrap_or(120);
        let max_retries = number("DEDUPE_MAX_RETRIES", 0, 100)?.map(|n| n as u32);
        if claiming {
            check_parks_outlast_a_lease(lease, max_retries)?;
        }
        let delay = |name| number(name, 0, MAX_DELAY_SECONDS).map(|d| d.map(|s| s as u32));
        Ok(DedupeConfig {
            store,
            ttl,
            shards: shards as u32,
            // The same layout as now: nothing to migrate.
            previous_layout: previous_layout.filter(|&p| p != Layout::Jump(shards as u32)),
            key_prefix: get("DEDUPE_KEY_PREFIX").unwrap_or_default(),
            claim_lease: claiming.then(|| Duration::from_secs(lease)),
            fingerprint,
            retry_delay_seconds: delay("DEDUPE_RETRY_DELAY_SECONDS")?,
            park_delay_seconds: delay("DEDUPE_PARK_DELAY_SECONDS")?
                .unwrap_or(DEFAULT_PARK_DELAY_SECONDS),
            max_retries,
            dead_letter_binding: get("DEDUPE_DEAD_LETTER"),
            durable_object_binding: get("DEDUPE_DO_BINDING").unwrap_or_else(|| "DEDUPE_DO".into()),
            kv_binding: get("DEDUPE_KV_BINDING").unwrap_or_else(|| "DEDUPE_KV".into()),
            d1_binding: get("DEDUPE_D1_BINDING").unwrap_or_else(|| "DEDUPE_D1".into()),
        })
    }

    /// The configured store, counting its requests into `round_trips`.
    pub fn store(&self, env: &Env, round_trips: RoundTrips) -> Result<WorkersStore, ConfigError> {
        // Also guards a hand-built config: every keyed message would fail to claim.
        if self.store == StoreKind::Kv && self.claim_lease.is_some() {
            return Err(ConfigError(
                "claiming needs the Durable Object or the D1 store: Workers KV cannot claim".into(),
            ));
        }
        Ok(match self.store {
            StoreKind::DurableObject => {
                let namespace = env
                    .durable_object(&self.durable_object_binding)
                    .map_err(|_| {
                        unbound(
                            "Durable Object namespace (class DedupeShard)",
                            &self.durable_object_binding,
                            "[[durable_objects.bindings]] name = {b} class_name = \"DedupeShard\"",
                        )
                    })?;
                WorkersStore::DurableObject(
                    DurableObjectStore::new(namespace, self.shards)
                        .with_previous(self.previous_layout)
                        .with_reshard_window(self.ttl)
                        .with_round_trips(round_trips),
                )
            }
            StoreKind::Kv => {
                let kv = env.kv(&self.kv_binding).map_err(|_| {
                    unbound(
                        "KV namespace",
                        &self.kv_binding,
                        "[[kv_namespaces]] binding = {b} id = \"<namespace id>\"",
                    )
                })?;
                WorkersStore::Kv(KvStore::new(kv).with_round_trips(round_trips))
            }
            StoreKind::D1 => {
                let db = env.d1(&self.d1_binding).map_err(|_| {
                    unbound(
                        "D1 database",
                        &self.d1_binding,
                        "[[d1_databases]] binding = {b} database_id = \"<database id>\"",
                    )
                })?;
                WorkersStore::D1(D1Store::new(db).with_round_trips(round_trips))
            }
        })
    }

    /// A guard over `store` with this configuration's TTL, claiming and prefix,
    /// reading time from `Date.now` and racing handlers against `setTimeout`, so
    /// claims are renewed while a slow handler runs.
    pub fn guard<S: bq_dedupe::Store>(&self, store: S) -> Guard<S, (), WorkersTimer> {
        let mut guard = Guard::new(store)
            .with_keyspace(KeySpace::new().with_prefix(&self.key_prefix))
            .with_clock(Arc::new(JsClock))
            .with_timer(WorkersTimer);
        if let Some(ttl) = self.ttl {
            guard = guard.with_ttl(ttl);
        }
        if let Some(lease) = self.claim_lease {
            guard = guard.with_claiming(lease);
        }
        if self.fingerprint {
            guard = guard.with_fingerprint();
        }
        guard
    }

    /// A consumer over `store` with this configuration's dead-letter producer and
    /// retry delay.
    pub fn consumer<S: bq_dedupe::Store>(
        &self,
        env: &Env,
        store: S,
    ) -> Result<QueueConsumer<S, (), WorkersTimer>, ConfigError> {
        let mut consumer = QueueConsumer::new(self.guard(store));
        if let Some(binding) = &self.dead_letter_binding {
            let producer = env.queue(binding).map_err(|_| {
                unbound(
                    "queue producer (DEDUPE_DEAD_LETTER)",
                    binding,
                    "[[queues.producers]] binding = {b} queue = \"<dead-letter queue>\"",
                )
            })?;
            consumer = consumer.with_dead_letter(producer);
        }
        if let Some(delay) = self.retry_delay_seconds {
            consumer = consumer.with_retry_delay(delay);
        }
        consumer = consumer.with_park_delay(self.park_delay_seconds);
        if let Some(max) = self.max_retries {
            consumer = consumer.with_max_retries(max);
        }
        Ok(consumer)
    }
}

/// A binding `env` does not hold as `what`, and the wrangler.toml line that
/// binds it (`{b}` in `toml` is the binding's quoted name). workers-rs's own
/// error ("invalid kv store: NAME") says less.
fn unbound(what: &str, binding: &str, toml: &str) -> ConfigError {
    let b = format!("{binding:?}");
    ConfigError(format!(
        "binding {b} is missing, or is not a {what}; wrangler.toml binds it with {}",
        toml.replace("{b}", &b)
    ))
}

impl QueueConsumer<WorkersStore, (), WorkersTimer> {
    /// Everything from `wrangler.toml`: the store, the guard and the consumer.
    pub fn from_env(env: &Env) -> Result<Self, ConfigError> {
        let config = DedupeConfig::from_env(env)?;
        let store = config.store(env, RoundTrips::new())?;
        config.consumer(env, store)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(vars: &[(&str, &str)]) -> Result<DedupeConfig, ConfigError> {
        DedupeConfig::from_vars(|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn defaults_are_one_durable_object_shard_with_claiming() {
        let c = config(&[]).unwrap();
        assert_eq!(c.store, StoreKind::DurableObject);
        assert_eq!(c.shards, 1);
        assert_eq!(c.claim_lease, Some(Duration::from_secs(120)));
        assert_eq!(c.park_delay_seconds, 45);
        assert_eq!(c.ttl, Some(DEFAULT_TTL));
        assert_eq!(c.previous_layout, None);
        assert_eq!(c.durable_object_binding, "DEDUPE_DO");
    }

    #[test]
    fn fingerprints_are_off_unless_turned_on() {
        assert!(!config(&[]).unwrap().fingerprint);
        assert!(config(&[("DEDUPE_FINGERPRINT", "on")]).unwrap().fingerprint);
        assert!(
            !config(&[("DEDUPE_FINGERPRINT", "off")])
                .unwrap()
                .fingerprint
        );
        let err = config(&[("DEDUPE_FINGERPRINT", "yes")]).unwrap_err();
        assert!(err.0.contains("DEDUPE_FINGERPRINT"), "{}", err.0);
    }

    #[test]
    fn default_window_is_the_longest_retention_plus_the_longest_retry_delay() {
        assert_eq!(DEFAULT_TTL, Duration::from_secs(14 * 86_400 + 12 * 3_600));
        assert_eq!(config(&[]).unwrap().ttl, Some(DEFAULT_TTL));
        assert_eq!(
            config(&[("DEDUPE_TTL_SECONDS", "")]).unwrap().ttl,
            Some(DEFAULT_TTL)
        );
        // Forever stays available, spelled out or as the 0 it always was.
        assert_eq!(
            config(&[("DEDUPE_TTL_SECONDS", "forever")]).unwrap().ttl,
            None
        );
        assert_eq!(config(&[("DEDUPE_TTL_SECONDS", "0")]).unwrap().ttl, None);
        assert_eq!(
            config(&[("DEDUPE_TTL_SECONDS", "60")]).unwrap().ttl,
            Some(Duration::from_secs(60))
        );
        // KV takes the default too (it is far above KV's 60 s minimum).
        let kv = config(&[("DEDUPE_STORE", "kv")]).unwrap();
        assert_eq!(kv.ttl, Some(DEFAULT_TTL));
    }

    #[test]
    fn previous_shards_names_the_layout_before_the_change() {
        let c = config(&[("DEDUPE_SHARDS", "4"), ("DEDUPE_PREVIOUS_SHARDS", "1")]).unwrap();
        assert_eq!(c.previous_layout, Some(Layout::Jump(1)));
        let c = config(&[
            ("DEDUPE_SHARDS", "4"),
            ("DEDUPE_PREVIOUS_SHARDS", "sha256-mod:2"),
        ])
        .unwrap();
        assert_eq!(c.previous_layout, Some(Layout::Sha256Mod(2)));
        // The same count as now: nothing to migrate.
        let c = config(&[("DEDUPE_SHARDS", "4"), ("DEDUPE_PREVIOUS_SHARDS", "4")]).unwrap();
        assert_eq!(c.previous_layout, None);
        let e = config(&[("DEDUPE_PREVIOUS_SHARDS", "0")]).unwrap_err();
        assert!(e.0.contains("DEDUPE_PREVIOUS_SHARDS"), "{e}");
        let e = config(&[("DEDUPE_PREVIOUS_SHARDS", "mod:2")]).unwrap_err();
        assert!(e.0.contains("sha256-mod:N"), "{e}");
        let e = config(&[("DEDUPE_STORE", "kv"), ("DEDUPE_PREVIOUS_SHARDS", "2")]).unwrap_err();
        assert!(e.0.contains("KV"), "{e}");
    }

    #[test]
    fn kv_cannot_claim_or_expire_under_a_minute() {
        assert!(
            config(&[("DEDUPE_STORE", "kv")])
                .unwrap()
                .claim_lease
                .is_none()
        );
        let e = config(&[("DEDUPE_STORE", "kv"), ("DEDUPE_CLAIMING", "on")]).unwrap_err();
        assert!(e.0.contains("atomic"), "{e}");
        let e = config(&[("DEDUPE_STORE", "kv"), ("DEDUPE_TTL_SECONDS", "30")]).unwrap_err();
        assert!(e.0.contains("60 s"), "{e}");
    }

    /// Hole 1 of the store-contract issue: retries that cannot outlast a lease.
    #[test]
    fn retries_that_cannot_outlast_the_lease_are_refused_naming_the_settings() {
        // Defaults: 3 retries of up to 12 h outlast a 120 s lease.
        assert!(config(&[]).is_ok());
        assert!(config(&[("DEDUPE_MAX_RETRIES", "1")]).is_ok());
        let e = config(&[("DEDUPE_MAX_RETRIES", "0")]).unwrap_err();
        assert!(
            e.0.contains("DEDUPE_MAX_RETRIES=0") && e.0.contains("DEDUPE_CLAIM_LEASE_SECONDS=120"),
            "{e}"
        );
        // Not "waits at most 0 s (43200 s per retry)" (a trial found it confusing).
        assert!(e.0.contains("has no retry to wait with"), "{e}");
        let e = config(&[
            ("DEDUPE_MAX_RETRIES", "1"),
            ("DEDUPE_CLAIM_LEASE_SECONDS", "86400"),
        ])
        .unwrap_err();
        assert!(e.0.contains("DEDUPE_MAX_RETRIES=1"), "{e}");
        let e = config(&[("DEDUPE_CLAIM_LEASE_SECONDS", "200000")]).unwrap_err();
        assert!(e.0.contains("default max_retries (3)"), "{e}");
        // Without claiming nothing parks.
        assert!(config(&[("DEDUPE_MAX_RETRIES", "0"), ("DEDUPE_CLAIMING", "off")]).is_ok());
    }

    /// A lease no queue retains a message for: a message parked behind the
    /// claim of a consumer that died was deleted by the queue before the claim
    /// lapsed, never run nor dead-lettered, though its retries outlast the
    /// lease (a review: 5 days with 10 retries was accepted).
    #[test]
    fn a_lease_past_the_longest_retention_is_refused() {
        let e = config(&[
            ("DEDUPE_MAX_RETRIES", "100"),
            ("DEDUPE_CLAIM_LEASE_SECONDS", "1209600"),
        ])
        .unwrap_err();
        assert!(e.0.contains("retention"), "{e}");
        assert!(
            config(&[
                ("DEDUPE_MAX_RETRIES", "100"),
                ("DEDUPE_CLAIM_LEASE_SECONDS", "432000"),
            ])
            .is_ok()
        );
    }

    #[test]
    fn bad_values_name_the_var() {
        let e = config(&[("DEDUPE_SHARDS", "many")]).unwrap_err();
        assert!(e.0.contains("DEDUPE_SHARDS"), "{e}");
        let e = config(&[("DEDUPE_SHARDS", "0")]).unwrap_err();
        assert!(e.0.contains("1..=1024"), "{e}");
        let e = config(&[("DEDUPE_PARK_DELAY_SECONDS", "50000")]).unwrap_err();
        assert!(
            e.0.contains("DEDUPE_PARK_DELAY_SECONDS") && e.0.contains("43200"),
            "{e}"
        );
        let e = config(&[("DEDUPE_TTL_SECONDS", "18446744073709551615")]).unwrap_err();
        assert!(e.0.contains("DEDUPE_TTL_SECONDS"), "{e}");
        let e = config(&[("DEDUPE_CLAIM_LEASE_SECONDS", "0")]).unwrap_err();
        assert!(e.0.contains("DEDUPE_CLAIM_LEASE_SECONDS"), "{e}");
        let e = config(&[("DEDUPE_STORE", "redis")]).unwrap_err();
        assert!(e.0.contains("DEDUPE_STORE"), "{e}");
    }
}
