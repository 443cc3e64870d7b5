//! Fuzzes the envelope decoders: never a panic, and the borrowed fast path and the
//! full owned decoder always agree on accept/reject (and the reason), the id, the
//! job, the trace id and the attempts. `Message::parse` is the scanner (falling
//! back to the reference for anything in doubt); `Envelope::decode` validates with
//! the serde_json reference alone, so the two are independent.

#![no_main]

use bq_dedupe::{Message, envelope::Envelope, envelope::Limits};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = Limits::default();
    let fast = Message::parse(data, &limits);
    let full = Envelope::decode(data, &limits);
    match (&fast, &full) {
        (Ok(msg), Ok(env)) => {
            assert_eq!(msg.id(), env.id(), "decoders disagree on meta.id");
            assert_eq!(msg.job(), env.job, "decoders disagree on job");
            assert_eq!(
                msg.trace_id(),
                env.trace_id,
                "decoders disagree on trace_id"
            );
            assert_eq!(msg.attempts(), env.attempts);
            // The canonical form decodes again to the same envelope.
            let again = Envelope::decode(
                env.to_json().as_bytes(),
                &Limits {
                    max_bytes: usize::MAX,
                },
            );
            assert_eq!(
                again.as_ref(),
                Ok(env),
                "canonical JSON does not round-trip"
            );
        }
        (Err(a), Err(b)) => assert_eq!(a, b, "decoders reject for different reasons"),
        _ => panic!("decoders disagree: fast {fast:?}, full {full:?}"),
    }
});
