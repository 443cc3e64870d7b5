//! Every kind of body the guard takes decodes as its bytes would: text is not
//! checked for UTF-8 again, but is decoded by the same rules (size limit
//! included), and bytes that are not UTF-8 are still rejected.

use std::borrow::Cow;
use std::rc::Rc;
use std::sync::Arc;

use bq_dedupe::{
    Guard, InMemoryStore, Message, OutcomeKind, block_on_ready, envelope::Body, envelope::Limits,
    envelope::Rejection,
};

const VALID: &str = r#"{"job":"urn:babel:orders:created","trace_id":"t-1","data":{"n":1},"meta":{"id":"body-1","schema_version":1}}"#;

/// What decoding gave, comparable: the id, or the rejection.
fn verdict(decoded: Result<Message<'_>, Rejection>) -> Result<Option<String>, Rejection> {
    decoded.map(|m| m.id().map(str::to_owned))
}

fn as_bytes(text: &str, limits: &Limits) -> Result<Option<String>, Rejection> {
    verdict(Message::parse(text.as_bytes(), limits))
}

#[test]
fn text_and_bytes_bodies_decode_alike() {
    let small = Limits { max_bytes: 40 };
    // 32 characters, 62 bytes: the limit counts bytes, for text too.
    let wide = format!("\"{}\"", "\u{e9}".repeat(30));
    let texts = [
        VALID,
        "not json",
        "[1,2]",
        r#"{"job":"j"}"#,
        "{\"a\":\"\u{e9}\"}",
        &wide,
    ];
    for limits in [Limits::default(), small] {
        for text in texts {
            let want = as_bytes(text, &limits);
            let got = [
                verdict(text.decode(&limits)),
                verdict(text.to_owned().decode(&limits)),
                verdict(Cow::Borrowed(text).decode(&limits)),
                verdict(Box::<str>::from(text).decode(&limits)),
                verdict(Rc::<str>::from(text).decode(&limits)),
                verdict(Arc::<str>::from(text).decode(&limits)),
                verdict(text.as_bytes().decode(&limits)),
                verdict(text.as_bytes().to_vec().decode(&limits)),
                verdict(Cow::Borrowed(text.as_bytes()).decode(&limits)),
                verdict((&text).decode(&limits)),
            ];
            for (i, got) in got.into_iter().enumerate() {
                assert_eq!(
                    got, want,
                    "body kind {i}, {text:?}, limit {}",
                    limits.max_bytes
                );
            }
        }
    }
    assert_eq!(
        as_bytes(VALID, &Limits::default()),
        Ok(Some("body-1".into()))
    );
    assert!(matches!(
        as_bytes(VALID, &small),
        Err(Rejection::TooLarge { .. })
    ));
    let decoded = wide.decode(&small);
    assert!(
        matches!(
            decoded,
            Err(Rejection::TooLarge {
                size: 62,
                limit: 40
            })
        ),
        "{decoded:?}"
    );
}

#[test]
fn bytes_that_are_not_utf8_are_still_rejected() {
    let mut bad = VALID.as_bytes().to_vec();
    bad[60] = 0xff;
    for decoded in [
        bad.decode(&Limits::default()),
        bad[..].decode(&Limits::default()),
    ] {
        assert!(
            matches!(&decoded, Err(Rejection::NotJson(why)) if why.contains("UTF-8")),
            "{decoded:?}"
        );
    }
    let arr: [u8; 3] = [b'{', 0xc3, b'}'];
    assert!(matches!(
        arr.decode(&Limits::default()),
        Err(Rejection::NotJson(_))
    ));
}

/// The guard's batch and single paths over text bodies: same outcomes as bytes.
#[test]
fn the_guard_takes_text_and_bytes_alike() {
    let texts: Vec<String> = vec![VALID.into(), "garbage".into(), VALID.into()];
    let bytes: Vec<Vec<u8>> = texts.iter().map(|t| t.clone().into_bytes()).collect();
    let kinds = |outcomes: Vec<bq_dedupe::Outcome<String>>| {
        outcomes.iter().map(|o| o.kind()).collect::<Vec<_>>()
    };
    let run = async |_: &Message<'_>| Ok::<(), String>(());
    let by_text =
        kinds(block_on_ready(Guard::new(InMemoryStore::new()).process_batch(&texts, run)).unwrap());
    let by_bytes =
        kinds(block_on_ready(Guard::new(InMemoryStore::new()).process_batch(&bytes, run)).unwrap());
    assert_eq!(by_text, by_bytes);
    assert_eq!(
        by_text,
        [
            OutcomeKind::Ran,
            OutcomeKind::Rejected,
            OutcomeKind::Skipped
        ]
    );
    let guard = Guard::new(InMemoryStore::new());
    let one = block_on_ready(guard.process(VALID, run)).unwrap();
    let again = block_on_ready(guard.process(VALID.as_bytes(), run)).unwrap();
    assert_eq!(
        (one.kind(), again.kind()),
        (OutcomeKind::Ran, OutcomeKind::Skipped)
    );
}

#[test]
fn data_reads_the_payload_as_your_type() {
    #[derive(serde::Deserialize, Debug, PartialEq)]
    struct Order {
        order_id: u64,
    }
    let raw = r#"{"job":"j","trace_id":"t","data":{"order_id":1042,"x":[1]},"meta":{"id":"a","schema_version":1},"extra":{"data":5}}"#;
    let msg = Message::parse_str(raw, &Limits::default()).unwrap();
    assert_eq!(msg.data::<Order>().unwrap(), Order { order_id: 1042 });
    let any: serde_json::Value = msg.data().unwrap();
    assert_eq!(any["x"][0], 1);
    let wrong = msg.data::<Vec<u8>>().unwrap_err();
    assert!(wrong.to_string().contains("invalid type"), "{wrong}");
}
