//! Time for the guard on Workers: a clock (`Date.now`) and a timer (`setTimeout`),
//! so claims are renewed while a slow handler runs (see `bq_dedupe::lease`).
//!
//! On `wasm32-unknown-unknown` the core has no clock of its own: without these
//! the guard could not tell when a lease needs renewing.

use std::time::Duration;

use bq_dedupe::{clock::Clock, lease::Timer};

/// `Date.now()`. On Workers it advances only across I/O (a Spectre mitigation),
/// which is exactly where a handler waits, so renewals are seen on time.
#[derive(Debug, Clone, Copy, Default)]
pub struct JsClock;

impl Clock for JsClock {
    fn now_ms(&self) -> u64 {
        js_sys::Date::now() as u64
    }
}

/// A `setTimeout` sleep ([`worker::Delay`]), cleared if the handler finishes first.
#[derive(Debug, Clone, Copy, Default)]
pub struct WorkersTimer;

impl Timer for WorkersTimer {
    async fn sleep(&self, duration: Duration) {
        worker::Delay::from(duration).await;
    }
}
