//! Configuration from `wrangler.toml` `[vars]` (all values are strings).
//!
//! | var                          | default          | meaning                                   |
//! |------------------------------|------------------|-------------------------------------------|
//! | `DEDUPE_STORE`               | `durable-object` | `durable-object` or `kv`                  |
//! | `DEDUPE_TTL_SECONDS`         | (none)           | how long an id counts as seen; none: forever |
//! | `DEDUPE_SHARDS`              | `1`              | Durable Objects the ids are spread over   |
//! | `DEDUPE_KEY_PREFIX`          | (empty)          | namespace for the ids in the store        |
//! | `DEDUPE_CLAIMING`            | `on` (DO), `off` (KV) | take an atomic claim before running  |
//! | `DEDUPE_CLAIM_LEASE_SECONDS` | `120`            | how long a crashed consumer's claim blocks |
//! | `DEDUPE_RETRY_DELAY_SECONDS` | (none)           | delay for retried messages                |
//! | `DEDUPE_PARK_DELAY_SECONDS`  | `45`             | delay for parked messages (claim held elsewhere) |
//!
//! Keep `max_retries x DEDUPE_PARK_DELAY_SECONDS` above the lease: a message parked
//! behind a crashed consumer's claim then runs once the lease ends instead of
//! reaching the dead-letter queue; and keep the lease above your handler's longest
//! run, or a second consumer may claim an id that is still running.
//! | `DEDUPE_DEAD_LETTER`         | (none)           | queue producer binding for poison messages |
//! | `DEDUPE_DO_BINDING`          | `DEDUPE_DO`      | the `DedupeShard` Durable Object binding  |
//! | `DEDUPE_KV_BINDING`          | `DEDUPE_KV`      | the KV namespace binding                  |

use std::time::Duration;

use bq_dedupe::{Guard, KeySpace};
use worker::Env;

use crate::consumer::{DEFAULT_PARK_DELAY_SECONDS, QueueConsumer};
use crate::durable::DurableObjectStore;
use crate::kv::{self, KvStore};
use crate::round_trips::RoundTrips;
use crate::store::WorkersStore;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    /// Strongly consistent, can claim: the default.
    DurableObject,
    /// Eventually consistent, cannot claim: best effort.
    Kv,
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

#[derive(Debug, Clone, PartialEq)]
pub struct DedupeConfig {
    pub store: StoreKind,
    pub ttl: Option<Duration>,
    pub shards: u32,
    pub key_prefix: String,
    /// `Some(lease)`: claiming on.
    pub claim_lease: Option<Duration>,
    pub retry_delay_seconds: Option<u32>,
    pub park_delay_seconds: u32,
    pub dead_letter_binding: Option<String>,
    pub durable_object_binding: String,
    pub kv_binding: String,
}

impl DedupeConfig {
    /// Reads the `DEDUPE_*` vars (see the module docs).
    pub fn from_env(env: &Env) -> Result<Self, ConfigError> {
        Self::from_vars(|name| env.var(name).ok().map(|v| v.to_string()))
    }

    /// The same from any lookup (tests, other sources).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let get = |name: &str| {
            var(name)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let number = |name: &str| -> Result<Option<u64>, ConfigError> {
            get(name)
                .map(|v| {
                    v.parse::<u64>().map_err(|_| {
                        ConfigError(format!("{name} must be a whole number, got {v:?}"))
                    })
                })
                .transpose()
        };
        let store = match get("DEDUPE_STORE").as_deref() {
            None | Some("durable-object") => StoreKind::DurableObject,
            Some("kv") => StoreKind::Kv,
            Some(other) => {
                return Err(ConfigError(format!(
                    "DEDUPE_STORE must be \"durable-object\" or \"kv\", got {other:?}"
                )));
            }
        };
        let claiming = match get("DEDUPE_CLAIMING").as_deref() {
            None => store == StoreKind::DurableObject,
            Some("on") => true,
            Some("off") => false,
            Some(other) => {
                return Err(ConfigError(format!(
                    "DEDUPE_CLAIMING must be \"on\" or \"off\", got {other:?}"
                )));
            }
        };
        if claiming && store == StoreKind::Kv {
            return Err(ConfigError(
                "DEDUPE_CLAIMING=on needs DEDUPE_STORE=durable-object: Workers KV has no \
                 atomic operation to claim with"
                    .into(),
            ));
        }
        let ttl = number("DEDUPE_TTL_SECONDS")?
            .filter(|&s| s > 0)
            .map(Duration::from_secs);
        if store == StoreKind::Kv {
            kv::check_ttl(ttl)
                .map_err(|e| ConfigError(format!("DEDUPE_TTL_SECONDS: {}", e.message)))?;
        }
        let shards = number("DEDUPE_SHARDS")?.unwrap_or(1);
        if !(1..=1024).contains(&shards) {
            return Err(ConfigError(format!(
                "DEDUPE_SHARDS must be 1..=1024, got {shards}"
            )));
        }
        let lease = number("DEDUPE_CLAIM_LEASE_SECONDS")?.unwrap_or(120).max(1);
        let retry_delay =
            number("DEDUPE_RETRY_DELAY_SECONDS")?.map(|s| u32::try_from(s).unwrap_or(u32::MAX));
        Ok(DedupeConfig {
            store,
            ttl,
            shards: shards as u32,
            key_prefix: get("DEDUPE_KEY_PREFIX").unwrap_or_default(),
            claim_lease: claiming.then(|| Duration::from_secs(lease)),
            retry_delay_seconds: retry_delay,
            park_delay_seconds: number("DEDUPE_PARK_DELAY_SECONDS")?
                .map_or(DEFAULT_PARK_DELAY_SECONDS, |s| {
                    u32::try_from(s).unwrap_or(u32::MAX)
                }),
            dead_letter_binding: get("DEDUPE_DEAD_LETTER"),
            durable_object_binding: get("DEDUPE_DO_BINDING").unwrap_or_else(|| "DEDUPE_DO".into()),
            kv_binding: get("DEDUPE_KV_BINDING").unwrap_or_else(|| "DEDUPE_KV".into()),
        })
    }

    /// The configured store, counting its requests into `round_trips`.
    pub fn store(&self, env: &Env, round_trips: RoundTrips) -> Result<WorkersStore, ConfigError> {
        Ok(match self.store {
            StoreKind::DurableObject => {
                let namespace = env
                    .durable_object(&self.durable_object_binding)
                    .map_err(|e| {
                        ConfigError(format!(
                            "Durable Object binding {:?} (class DedupeShard): {e}",
                            self.durable_object_binding
                        ))
                    })?;
                WorkersStore::DurableObject(
                    DurableObjectStore::new(namespace, self.shards).with_round_trips(round_trips),
                )
            }
            StoreKind::Kv => {
                let kv = env.kv(&self.kv_binding).map_err(|e| {
                    ConfigError(format!("KV namespace binding {:?}: {e}", self.kv_binding))
                })?;
                WorkersStore::Kv(KvStore::new(kv).with_round_trips(round_trips))
            }
        })
    }

    /// A guard over `store` with this configuration's TTL, claiming and prefix.
    pub fn guard<S: bq_dedupe::Store>(&self, store: S) -> Guard<S> {
        let mut guard =
            Guard::new(store).with_keyspace(KeySpace::new().with_prefix(&self.key_prefix));
        if let Some(ttl) = self.ttl {
            guard = guard.with_ttl(ttl);
        }
        if let Some(lease) = self.claim_lease {
            guard = guard.with_claiming(lease);
        }
        guard
    }

    /// A consumer over `store` with this configuration's dead-letter producer and
    /// retry delay.
    pub fn consumer<S: bq_dedupe::Store>(
        &self,
        env: &Env,
        store: S,
    ) -> Result<QueueConsumer<S>, ConfigError> {
        let mut consumer = QueueConsumer::new(self.guard(store));
        if let Some(binding) = &self.dead_letter_binding {
            let producer = env.queue(binding).map_err(|e| {
                ConfigError(format!(
                    "DEDUPE_DEAD_LETTER: queue producer binding {binding:?}: {e}"
                ))
            })?;
            consumer = consumer.with_dead_letter(producer);
        }
        if let Some(delay) = self.retry_delay_seconds {
            consumer = consumer.with_retry_delay(delay);
        }
        consumer = consumer.with_park_delay(self.park_delay_seconds);
        Ok(consumer)
    }
}

impl QueueConsumer<WorkersStore> {
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
        assert_eq!(c.ttl, None);
        assert_eq!(c.durable_object_binding, "DEDUPE_DO");
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

    #[test]
    fn bad_values_name_the_var() {
        let e = config(&[("DEDUPE_SHARDS", "many")]).unwrap_err();
        assert!(e.0.contains("DEDUPE_SHARDS"), "{e}");
        let e = config(&[("DEDUPE_SHARDS", "0")]).unwrap_err();
        assert!(e.0.contains("1..=1024"), "{e}");
        let e = config(&[("DEDUPE_STORE", "redis")]).unwrap_err();
        assert!(e.0.contains("DEDUPE_STORE"), "{e}");
    }
}
