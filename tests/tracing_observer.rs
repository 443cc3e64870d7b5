//! The ready `tracing` observer (feature `tracing`): outcomes and store errors
//! arrive as events with their codes.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use bq_dedupe::observe::Tracing;
use bq_dedupe::{Guard, InMemoryStore, block_on_ready};
use common::{FlakyStore, envelope};

#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Write for Buffer {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn outcomes_and_store_errors_become_tracing_events() {
    let buffer = Buffer::default();
    let writer = buffer.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        let guard = Guard::new(InMemoryStore::new()).with_observer(Tracing);
        for _ in 0..2 {
            let _ = block_on_ready(
                guard.process(envelope("t-1").as_bytes(), async |_| Ok::<(), String>(())),
            );
        }
        let flaky = FlakyStore::new();
        flaky.faults.seen.set(true);
        let guard = Guard::new(flaky).with_observer(Tracing);
        let _ = block_on_ready(
            guard.process(envelope("t-2").as_bytes(), async |_| Ok::<(), String>(())),
        );
    });
    let log = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
    assert!(
        log.contains("DEBUG") && log.contains("outcome=\"run-ok\"") && log.contains("key=\"t-1\""),
        "{log}"
    );
    assert!(log.contains("outcome=\"skip\""), "{log}");
    assert!(
        log.contains("WARN") && log.contains("store error") && log.contains("op=Seen"),
        "{log}"
    );
    assert!(log.contains("outcome=\"store-unavailable\""), "{log}");
}
