//! The sync client blocks on a tokio runtime of its own, and tokio refuses to
//! start one on a thread already driving a runtime (it panics): a store call
//! awaited in an async host on tokio would. So every call that reaches the
//! server runs where blocking is allowed.

use tokio::runtime::{Handle, RuntimeFlavor};

/// Runs `f` where the client may block: in place outside any runtime, in
/// place with the runtime's work handed to another thread on a multi-thread
/// runtime (`block_in_place`), else on a thread of its own.
pub(super) fn off_runtime<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Err(_) => f(),
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        Ok(_) => std::thread::scope(|scope| match scope.spawn(f).join() {
            Ok(value) => value,
            Err(panic) => std::panic::resume_unwind(panic),
        }),
    }
}

/// As [`off_runtime`], for work that cannot move to another thread (a
/// handler's transaction): on a current-thread runtime it runs in place,
/// which only that runtime's blocking threads (`spawn_blocking`) allow.
pub(super) fn off_multi_thread_runtime<T>(f: impl FnOnce() -> T) -> T {
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}
