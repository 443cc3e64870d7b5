//! The strongly consistent store: ids live in SQLite-backed Durable Objects.
//!
//! - [`DedupeShard`]: the object. One table of `(key, token, expires_at)`; every
//!   request is applied without awaiting in between, so a batch's check-and-claim
//!   is atomic against every other consumer. An alarm sweeps expired rows.
//! - [`DurableObjectStore`]: the consumer side. Ids are spread over N objects by a
//!   stable hash of the key; a batch costs one request per shard touched to decide
//!   and one to commit.
//! - [`protocol`]: the JSON requests between the two; `table`: the SQL;
//!   `layouts`: the registry of layouts resharded through (one reshard per window).

mod client;
mod layouts;
mod object;
pub mod protocol;
mod table;

pub use client::DurableObjectStore;
pub use object::DedupeShard;
