//! Time for TTLs and claim leases, injectable so tests and hosts without a system
//! clock (`wasm32-unknown-unknown`) can supply their own.

use std::sync::atomic::{AtomicU64, Ordering};

/// Milliseconds since the Unix epoch.
pub trait Clock: Send + Sync {
    /// The time now, in ms since the Unix epoch.
    fn now_ms(&self) -> u64;
}

/// The operating system's wall clock (not available on `wasm32-unknown-unknown`,
/// where the host passes its own clock, e.g. `Date.now`).
#[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

#[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    }
}

/// The guard's default clock on native targets: never behind the time that has
/// passed. It counts monotonic time from its creation, plus the furthest the
/// wall clock (by default [`SystemClock`]) has been ahead of that count, so it
/// never steps back and never stops. A wall clock stepped back (NTP, an
/// operator's `date`) made a claim that had run out read as in its lease, and
/// on a store that cannot renew a late success was `run-ok` (a review); the
/// monotonic count alone would miss a suspended VM's sleep, which the store's
/// expiry counts; and the later of the two froze for as long as a step
/// forward and back (a review).
#[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
#[derive(Debug)]
pub struct SteadyClock<W = SystemClock> {
    wall: W,
    start: (u64, std::time::Instant),
    /// How far the wall clock has been ahead of the count at most (ms).
    ahead: AtomicU64,
}

#[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
impl SteadyClock {
    /// Over the system's wall clock.
    pub fn new() -> Self {
        Self::over(SystemClock)
    }
}

#[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
impl Default for SteadyClock {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
impl<W: Clock> SteadyClock<W> {
    /// Over `wall`, read now as where the monotonic count starts.
    pub fn over(wall: W) -> Self {
        let start = (wall.now_ms(), std::time::Instant::now());
        SteadyClock {
            wall,
            start,
            ahead: AtomicU64::new(0),
        }
    }
}

#[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
impl<W: Clock> Clock for SteadyClock<W> {
    fn now_ms(&self) -> u64 {
        let (at, since) = self.start;
        let counted = at.saturating_add(since.elapsed().as_millis() as u64);
        let ahead = self.wall.now_ms().saturating_sub(counted);
        let ahead = self.ahead.fetch_max(ahead, Ordering::SeqCst).max(ahead);
        counted.saturating_add(ahead)
    }
}

/// A clock that moves only when told to: for tests and simulations.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    /// A clock that reads `start_ms` until moved.
    pub fn new(start_ms: u64) -> Self {
        ManualClock(AtomicU64::new(start_ms))
    }
    /// Moves the clock on by `ms`.
    pub fn advance(&self, ms: u64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
    /// Sets the clock to `ms`.
    pub fn set(&self, ms: u64) {
        self.0.store(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

impl<C: Clock + ?Sized> Clock for std::sync::Arc<C> {
    fn now_ms(&self) -> u64 {
        (**self).now_ms()
    }
}

#[cfg(all(test, not(all(target_arch = "wasm32", target_os = "unknown"))))]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn a_steady_clock_counts_time_passed_whatever_its_wall_clock_does() {
        let wall = Arc::new(ManualClock::new(1_000_000));
        let steady = SteadyClock::over(wall.clone());
        assert_eq!(steady.now_ms(), 1_000_000);
        std::thread::sleep(Duration::from_millis(60));
        wall.set(1_000_000 - 10_000); // stepped back
        let after = steady.now_ms();
        assert!(after >= 1_000_060, "the time passed is counted: {after}");
        wall.set(1_000_000 + 5_000); // stepped on (or a sleep the monotonic clock missed)
        assert_eq!(steady.now_ms(), 1_005_000);
        wall.set(1_000_000);
        let after = steady.now_ms();
        assert!(after >= 1_005_000, "never back");
        // Stepped on and back, it goes on counting (it froze at the peak for
        // as long as the step: a review).
        std::thread::sleep(Duration::from_millis(60));
        assert!(steady.now_ms() >= after + 50, "still counting");
    }
}
