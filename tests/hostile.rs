//! Hostile and malformed input: every one gets a clear verdict, nothing panics,
//! nothing is silently dropped.

mod common;

use std::cell::Cell;

use bq_dedupe::envelope::MAX_DEPTH;
use bq_dedupe::{
    Guard, InMemoryStore, Message, Outcome, block_on_ready, envelope::Envelope, envelope::Limits,
    envelope::Rejection,
};
use common::{envelope, envelope_with};

fn parse(raw: &[u8]) -> Result<Message<'_>, Rejection> {
    Message::parse(raw, &Limits::default())
}

fn deliver_twice(body: &[u8]) -> (Outcome<String>, Outcome<String>, u32) {
    let guard = Guard::new(InMemoryStore::new());
    let effects = Cell::new(0);
    let run = || {
        block_on_ready(guard.process(body, async |_| {
            effects.set(effects.get() + 1);
            Ok::<(), String>(())
        }))
        .unwrap()
    };
    let (a, b) = (run(), run());
    (a, b, effects.get())
}

#[test]
fn non_json_is_rejected_with_the_parser_reason() {
    for raw in [
        &b""[..],
        b"not json",
        b"{",
        b"{\"job\":}",
        b"\xff\xfe",
        b"{\"job\":\"\xc3\x28\"}",
    ] {
        match parse(raw) {
            Err(Rejection::NotJson(why)) => assert!(!why.is_empty()),
            other => panic!("{raw:?}: expected NotJson, got {other:?}"),
        }
    }
}

#[test]
fn json_that_is_not_an_object_is_rejected() {
    for raw in ["null", "42", "\"s\"", "[1,2]", "true"] {
        assert_eq!(
            parse(raw.as_bytes()).unwrap_err(),
            Rejection::NotAnObject,
            "{raw}"
        );
    }
}

#[test]
fn trailing_garbage_is_not_json() {
    let raw = format!("{} trailing", envelope("a"));
    assert!(matches!(parse(raw.as_bytes()), Err(Rejection::NotJson(_))));
}

#[test]
fn one_megabyte_of_data_is_accepted_and_deduped() {
    let mut env: serde_json::Value = serde_json::from_str(&envelope("big")).unwrap();
    env["data"]["blob"] = "x".repeat(1_000_000).into();
    let raw = env.to_string();
    assert!(raw.len() > 1_000_000 && raw.len() < Limits::default().max_bytes);
    let (a, b, effects) = deliver_twice(raw.as_bytes());
    assert_eq!((a, b, effects), (Outcome::Ran, Outcome::Skipped, 1));
}

#[test]
fn oversized_envelope_is_rejected_before_parsing() {
    let raw = vec![b' '; Limits::default().max_bytes + 1];
    assert_eq!(
        parse(&raw).unwrap_err(),
        Rejection::TooLarge {
            size: raw.len(),
            limit: Limits::default().max_bytes
        }
    );
    let small = Limits { max_bytes: 64 };
    assert!(matches!(
        Message::parse(envelope("a").as_bytes(), &small),
        Err(Rejection::TooLarge { .. })
    ));
}

#[test]
fn ten_thousand_deep_nesting_is_rejected_without_overflowing_the_stack() {
    for (open, close) in [("[", "]"), ("{\"a\":", "}")] {
        let deep = format!("{}1{}", open.repeat(10_000), close.repeat(10_000));
        let in_data = envelope("deep").replace("{\"order_id\":1042}", &format!("{{\"x\":{deep}}}"));
        assert_eq!(
            parse(in_data.as_bytes()).unwrap_err(),
            Rejection::TooDeep { limit: MAX_DEPTH }
        );
        // Also in an unknown field that the fast path only walks.
        let in_extra = envelope("deep").replacen('{', &format!("{{\"extra\":{deep},"), 1);
        assert_eq!(
            parse(in_extra.as_bytes()).unwrap_err(),
            Rejection::TooDeep { limit: MAX_DEPTH }
        );
        assert_eq!(
            Envelope::decode(in_extra.as_bytes(), &Limits::default()).unwrap_err(),
            Rejection::TooDeep { limit: MAX_DEPTH }
        );
    }
}

#[test]
fn moderate_nesting_below_the_limit_is_accepted_by_both_decoders() {
    let deep = format!("{}1{}", "[".repeat(100), "]".repeat(100));
    let raw = envelope("ok").replace("{\"order_id\":1042}", &format!("{{\"x\":{deep}}}"));
    assert!(parse(raw.as_bytes()).is_ok());
    assert!(Envelope::decode(raw.as_bytes(), &Limits::default()).is_ok());
}

#[test]
fn ten_kilobyte_id_is_a_key_like_any_other() {
    let id = "k".repeat(10 * 1024);
    let (a, b, effects) = deliver_twice(envelope(&id).as_bytes());
    assert_eq!((a, b, effects), (Outcome::Ran, Outcome::Skipped, 1));
}

#[test]
fn unicode_and_control_characters_in_ids_are_kept_verbatim() {
    let ids = [
        "café—☕",
        "😀\u{200d}😀",
        "a\u{0}b",
        "line\nbreak",
        "tab\there",
        "\u{7f}\u{1b}[31m",
        "\u{202e}rtl",
        "' OR 1=1; --",
        "*\r\n$3\r\nDEL\r\n",
        "{\"nested\":\"json\"}",
    ];
    let guard = Guard::new(InMemoryStore::new());
    let effects = Cell::new(0);
    for id in ids {
        let body = envelope(id);
        assert_eq!(parse(body.as_bytes()).unwrap().id(), Some(id));
        for expected in [Outcome::Ran, Outcome::Skipped] {
            let got = block_on_ready(guard.process(body.as_bytes(), async |_| {
                effects.set(effects.get() + 1);
                Ok::<(), String>(())
            }))
            .unwrap();
            assert_eq!(got, expected, "id {id:?}");
        }
    }
    assert_eq!(effects.get() as usize, ids.len());
    let mut stored: Vec<_> = guard.store().entries().into_iter().map(|e| e.key).collect();
    let mut want: Vec<_> = ids.iter().map(|s| s.to_string()).collect();
    stored.sort();
    want.sort();
    assert_eq!(stored, want, "ids are stored exactly");
}

#[test]
fn escaped_and_literal_spellings_of_one_id_are_the_same_key() {
    let literal = envelope("id-1");
    let escaped = literal.replace("\"id-1\"", "\"\\u0069d-1\"");
    assert_ne!(literal, escaped);
    let guard = Guard::new(InMemoryStore::new());
    let ok = async |_: &Message<'_>| Ok::<(), String>(());
    assert_eq!(
        block_on_ready(guard.process(literal.as_bytes(), ok)).unwrap(),
        Outcome::Ran
    );
    assert_eq!(
        block_on_ready(guard.process(escaped.as_bytes(), ok)).unwrap(),
        Outcome::Skipped
    );
}

#[test]
fn uuid_case_differences_are_different_ids() {
    let lower = "f1e2d3c4-b5a6-4789-90ab-cdef01234567";
    let guard = Guard::new(InMemoryStore::new());
    let ok = async |_: &Message<'_>| Ok::<(), String>(());
    assert_eq!(
        block_on_ready(guard.process(envelope(lower).as_bytes(), ok)).unwrap(),
        Outcome::Ran
    );
    let upper = envelope(&lower.to_uppercase());
    assert_eq!(
        block_on_ready(guard.process(upper.as_bytes(), ok)).unwrap(),
        Outcome::Ran
    );
}

#[test]
fn duplicate_json_keys_take_the_last_value_like_json_parse() {
    let raw = r#"{"job":"urn:a","job":"urn:b","trace_id":"t","data":{},
        "meta":{"id":"first","schema_version":1,"id":"last"},"attempts":0}"#;
    let msg = parse(raw.as_bytes()).unwrap();
    assert_eq!((msg.id(), msg.job()), (Some("last"), "urn:b"));
    let env = msg.envelope().unwrap();
    assert_eq!((env.id(), env.job.as_str()), (Some("last"), "urn:b"));
    // A later invalid duplicate wins too, and rejects.
    let raw = r#"{"job":"urn:a","trace_id":"t","data":{},"data":5,"meta":{"schema_version":1}}"#;
    assert!(matches!(
        parse(raw.as_bytes()),
        Err(Rejection::DataNotObject { .. })
    ));
}

/// Rejected, saying what it is: serde_json's "unexpected end of hex escape"
/// named none (a JS string with a lone surrogate comes as such an escape,
/// at a column of text the user never wrote: a trial's finding).
#[test]
fn lone_surrogate_escapes_are_not_json_and_say_so() {
    for lone in ["\\ud800", "\\udc00", "\\ud800\\u0041"] {
        let raw = envelope("x").replace("\"x\"", &format!("\"{lone}\""));
        let rejection = parse(raw.as_bytes()).unwrap_err();
        assert!(
            matches!(rejection, Rejection::NotJson(_)),
            "{lone}: {rejection:?}"
        );
        assert!(
            rejection.to_string().contains("unpaired UTF-16 surrogate"),
            "{lone}: {rejection}"
        );
    }
}

#[test]
fn non_string_ids_fail_open_rather_than_reject() {
    for id in ["1", "1.5", "true", "[\"a\"]", "{\"a\":1}"] {
        let raw = envelope_with(Some(serde_json::from_str(id).unwrap()));
        assert_eq!(parse(raw.as_bytes()).unwrap().id(), None, "{id}");
        let (a, b, effects) = deliver_twice(raw.as_bytes());
        assert_eq!(
            (a, b, effects),
            (Outcome::FailOpen(Ok(())), Outcome::FailOpen(Ok(())), 2)
        );
    }
}
