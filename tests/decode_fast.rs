//! The two envelope decoders agree: `Message::parse` (the scanner, falling back to
//! the reference) and `Envelope::decode` (the reference decoder
//! alone, then the owned tree). On every input below, and on random mutations of a
//! valid envelope, both accept with the same id, job, trace id and attempts, or both
//! reject with the same `Rejection`. The inputs sit on the fast path's edges: nesting
//! at the depth limit, out-of-range numbers, escapes, duplicate keys, the job/urn
//! alias, odd whitespace and trailing text.

use bq_dedupe::envelope::MAX_DEPTH;
use bq_dedupe::{Message, envelope::Envelope, envelope::Limits, envelope::Rejection};
use proptest::prelude::*;

/// A workload-shaped envelope (the bench's lines look like this).
const BASE: &str = r#"{"job":"urn:babel:orders:shipped","trace_id":"f10f5e1a-01ba-4956-9582-8a4511ed9ff8","data":{"order_id":1000000,"amount":143.18,"currency":"CHF","customer":"cus_915221"},"meta":{"id":"60a7c782-d326-426c-876e-7fc44dd0bb78","queue":"fulfilment","lang":"node","schema_version":1,"created_at":1749132727031},"attempts":0}"#;

/// Both decoders' answers, compared; returns whether the input was accepted.
fn agree(raw: &[u8]) -> bool {
    let limits = Limits::default();
    let fast = Message::parse(raw, &limits);
    let full = Envelope::decode(raw, &limits);
    let shown = String::from_utf8_lossy(raw);
    match (&fast, &full) {
        (Ok(msg), Ok(env)) => {
            assert_eq!(msg.id(), env.id(), "meta.id differs for {shown}");
            assert_eq!(msg.job(), env.job, "job differs for {shown}");
            assert_eq!(msg.trace_id(), env.trace_id, "trace_id differs for {shown}");
            assert_eq!(msg.attempts(), env.attempts, "attempts differ for {shown}");
            true
        }
        (Err(a), Err(b)) => {
            assert_eq!(a, b, "rejected for different reasons: {shown}");
            false
        }
        _ => panic!("decoders disagree on {shown}: fast {fast:?}, full {full:?}"),
    }
}

fn with_data(data: &str) -> String {
    BASE.replace(
        r#"{"order_id":1000000,"amount":143.18,"currency":"CHF","customer":"cus_915221"}"#,
        data,
    )
}

fn with_meta_field(field: &str) -> String {
    BASE.replace(r#""queue":"fulfilment""#, field)
}

fn with_top_field(field: &str) -> String {
    BASE.replacen('{', &format!("{{{field},"), 1)
}

fn nested(depth: usize) -> String {
    format!("{}1{}", "[".repeat(depth), "]".repeat(depth))
}

#[test]
fn the_base_envelope_is_accepted_by_both() {
    assert!(agree(BASE.as_bytes()));
    let msg = Message::parse(BASE.as_bytes(), &Limits::default()).unwrap();
    assert_eq!(msg.id(), Some("60a7c782-d326-426c-876e-7fc44dd0bb78"));
    assert_eq!(msg.job(), "urn:babel:orders:shipped");
    assert_eq!(msg.raw(), BASE);
}

#[test]
fn nesting_around_the_depth_limit() {
    // The envelope and `data` are two levels; the limit counts every container.
    for depth in [
        MAX_DEPTH - 4,
        MAX_DEPTH - 3,
        MAX_DEPTH - 2,
        MAX_DEPTH - 1,
        MAX_DEPTH,
        300,
    ] {
        let inner = nested(depth);
        for raw in [
            with_data(&format!(r#"{{"x":{inner}}}"#)),
            with_top_field(&format!(r#""extra":{inner}"#)),
            with_meta_field(&format!(r#""trail":{inner}"#)),
        ] {
            agree(raw.as_bytes());
        }
    }
    // Just inside the limit is accepted, just past it is too-deep, in both.
    let ok = with_data(&format!(r#"{{"x":{}}}"#, nested(MAX_DEPTH - 3)));
    assert!(agree(ok.as_bytes()));
    let deep = with_data(&format!(r#"{{"x":{}}}"#, nested(MAX_DEPTH - 2)));
    assert_eq!(
        Message::parse(deep.as_bytes(), &Limits::default()).unwrap_err(),
        Rejection::TooDeep { limit: MAX_DEPTH }
    );
    // Many brackets inside strings do not nest anything.
    let quoted = with_data(&format!(r#"{{"x":"{}"}}"#, "[".repeat(500)));
    assert!(agree(quoted.as_bytes()));
}

#[test]
fn numbers_out_of_range_or_malformed() {
    let numbers = [
        "1e400",
        "-1e400",
        "1e308",
        "1.7976931348623157e308",
        "1.8e308",
        "4.9e-324",
        "1e-400",
        "18446744073709551615",
        "18446744073709551616",
        "-9223372036854775808",
        "-9223372036854775809",
        "-0",
        "-0.0",
        "0.0",
        "1.0",
        "1e0",
        "1E+2",
        "01",
        "-",
        "1.",
        ".5",
        "+1",
        "1e",
        "1e+",
        "-01",
        "0x10",
        "NaN",
        "Infinity",
        "-Infinity",
        "1_000",
    ];
    let long = format!("1{}", "0".repeat(400));
    // Over f64's range however small the exponent (found by review).
    let long_scaled_down = format!("1{}e-1", "0".repeat(400));
    let long_at_the_edge = format!("1{}e-0", "0".repeat(309));
    for n in numbers
        .iter()
        .copied()
        .chain([long.as_str(), &long_scaled_down, &long_at_the_edge])
    {
        for raw in [
            with_data(&format!(r#"{{"n":{n}}}"#)),
            with_data(&format!(r#"{{"n":[{n}]}}"#)),
            with_top_field(&format!(r#""n":{n}"#)),
            with_meta_field(&format!(r#""n":{n}"#)),
            BASE.replace(r#""schema_version":1"#, &format!(r#""schema_version":{n}"#)),
            BASE.replace(r#""attempts":0"#, &format!(r#""attempts":{n}"#)),
            BASE.replace(
                r#""id":"60a7c782-d326-426c-876e-7fc44dd0bb78""#,
                &format!(r#""id":{n}"#),
            ),
        ] {
            agree(raw.as_bytes());
        }
    }
    let huge = with_data(r#"{"n":1e400}"#);
    assert!(matches!(
        Message::parse(huge.as_bytes(), &Limits::default()),
        Err(Rejection::NotJson(_))
    ));
}

#[test]
fn escapes_in_ids_keys_and_payloads() {
    let cases = [
        // Escapes decoded in the id: the same id as its plain spelling.
        BASE.replace("60a7c782-d326", r"\u0036\u0030a7c782-d326"),
        BASE.replace(r#""id":"#, r#""\u0069d":"#),
        BASE.replace(r#""job":"#, r#""j\u006fb":"#),
        BASE.replace(r#""meta":"#, r#""m\u0065ta":"#),
        BASE.replace("urn:babel", r"urn:\/babel"),
        BASE.replace("60a7c782", r#"60a7\"c782"#),
        BASE.replace("60a7c782", r"60a7\ud83d\ude00c782"),
        // Invalid escapes anywhere are not JSON.
        BASE.replace("60a7c782", r"60a7\ud800c782"),
        BASE.replace("60a7c782", r"60a7\udc00c782"),
        BASE.replace("60a7c782", r"60a7\uZZZZc782"),
        BASE.replace("60a7c782", r"60a7\xc782"),
        with_data(r#"{"k\uZZZZ":1}"#),
        with_data(r#"{"k\ud800":1}"#),
        with_data(r#"{"k":"\ud800"}"#),
        with_data(r#"{"k":"\u00e9\n\t"}"#),
        with_top_field(r#""\uZZZZ":1"#),
        with_meta_field(r#""q":"\ud800""#),
        // Raw control characters inside strings are not JSON; DEL is fine.
        BASE.replace("60a7c782", "60a7\u{1}c782"),
        with_data("{\"k\":\"a\tb\"}"),
        with_data("{\"k\":\"a\u{7f}b\"}"),
        with_data("{\"k\u{1f}\":1}"),
    ];
    for raw in &cases {
        agree(raw.as_bytes());
    }
    let escaped = Message::parse(cases[0].as_bytes(), &Limits::default()).unwrap();
    assert_eq!(escaped.id(), Some("60a7c782-d326-426c-876e-7fc44dd0bb78"));
    let key = Message::parse(cases[1].as_bytes(), &Limits::default()).unwrap();
    assert_eq!(key.id(), Some("60a7c782-d326-426c-876e-7fc44dd0bb78"));
}

#[test]
fn duplicate_keys_last_one_wins() {
    let cases = [
        BASE.replacen(
            r#""job":"urn:babel:orders:shipped""#,
            r#""job":"a","job":"b""#,
            1,
        ),
        BASE.replacen(
            r#""job":"urn:babel:orders:shipped""#,
            r#""job":"a","job":"  ""#,
            1,
        ),
        BASE.replacen(
            r#""job":"urn:babel:orders:shipped""#,
            r#""job":" ","job":"b""#,
            1,
        ),
        with_meta_field(r#""id":"first""#),
        BASE.replace(
            r#""attempts":0}"#,
            r#""attempts":0,"meta":{"schema_version":1}}"#,
        ),
        BASE.replace(
            r#""attempts":0}"#,
            r#""attempts":0,"meta":{"schema_version":1,"id":"second"}}"#,
        ),
        BASE.replace(r#""attempts":0}"#, r#""attempts":0,"meta":7}"#),
        BASE.replace(r#""attempts":0}"#, r#""attempts":0,"data":"x"}"#),
        BASE.replace(r#""attempts":0}"#, r#""attempts":0,"data":{}}"#),
        with_top_field(r#""data":"x""#),
        BASE.replace(r#""attempts":0}"#, r#""attempts":0,"attempts":3}"#),
        BASE.replace(r#""attempts":0}"#, r#""attempts":0,"attempts":-1}"#),
        BASE.replace(r#""attempts":0}"#, r#""attempts":0,"trace_id":"t2"}"#),
        with_meta_field(r#""schema_version":2"#),
    ];
    for raw in &cases {
        agree(raw.as_bytes());
    }
    let job = Message::parse(cases[0].as_bytes(), &Limits::default()).unwrap();
    assert_eq!(job.job(), "b");
    let meta = Message::parse(cases[5].as_bytes(), &Limits::default()).unwrap();
    assert_eq!(meta.id(), Some("second"));
    let meta = Message::parse(cases[4].as_bytes(), &Limits::default()).unwrap();
    assert_eq!(meta.id(), None);
}

#[test]
fn the_job_urn_alias_and_blank_rules() {
    let job = r#""job":"urn:babel:orders:shipped""#;
    let cases = [
        BASE.replace(job, r#""urn":"urn:babel:orders:shipped""#),
        BASE.replace(job, r#""urn":"  ""#),
        BASE.replace(job, r#""job":null,"urn":"u""#),
        BASE.replace(job, r#""job":"","urn":"u""#),
        BASE.replace(job, r#""job":" \t\n","urn":"u""#),
        BASE.replace(job, r#""urn":"u","job":"j""#),
        BASE.replace(job, r#""job":1"#),
        BASE.replace(job, r#""job":"\u00a0""#),
        BASE.replace(job, "\"job\":\"\u{a0}\""),
        BASE.replace(job, "\"job\":\"\u{3000}\""),
        BASE.replace(job, r#""jobs":"x""#),
        BASE.replace(
            r#""trace_id":"f10f5e1a-01ba-4956-9582-8a4511ed9ff8""#,
            r#""trace_id":" ""#,
        ),
        BASE.replace(
            r#""trace_id":"f10f5e1a-01ba-4956-9582-8a4511ed9ff8""#,
            r#""trace_id":5"#,
        ),
        BASE.replace(r#""trace_id":"f10f5e1a-01ba-4956-9582-8a4511ed9ff8","#, ""),
        BASE.replace(r#","attempts":0"#, ""),
        BASE.replace(r#""id":"60a7c782-d326-426c-876e-7fc44dd0bb78","#, ""),
        BASE.replace(r#""60a7c782-d326-426c-876e-7fc44dd0bb78""#, r#""""#),
        BASE.replace(r#""60a7c782-d326-426c-876e-7fc44dd0bb78""#, r#"" ""#),
        BASE.replace(r#""60a7c782-d326-426c-876e-7fc44dd0bb78""#, "null"),
        BASE.replace(r#""60a7c782-d326-426c-876e-7fc44dd0bb78""#, "true"),
        BASE.replace(r#""60a7c782-d326-426c-876e-7fc44dd0bb78""#, r#"{"a":1}"#),
        BASE.replace(r#""60a7c782-d326-426c-876e-7fc44dd0bb78""#, r#"["a"]"#),
        BASE.replace(r#""schema_version":1,"#, ""),
        with_data("[]"),
        with_data("null"),
        with_data(r#""{}""#),
    ];
    for raw in &cases {
        agree(raw.as_bytes());
    }
    let urn = Message::parse(cases[0].as_bytes(), &Limits::default()).unwrap();
    assert_eq!(urn.job(), "urn:babel:orders:shipped");
    assert_eq!(
        Message::parse(cases[2].as_bytes(), &Limits::default()).unwrap_err(),
        Rejection::MissingJob
    );
    let blank = Message::parse(cases[17].as_bytes(), &Limits::default()).unwrap();
    assert_eq!(blank.id(), Some(" "));
}

#[test]
fn whitespace_literals_trailing_text_and_top_level_kinds() {
    let pretty =
        serde_json::to_string_pretty(&serde_json::from_str::<serde_json::Value>(BASE).unwrap())
            .unwrap();
    let cases = [
        pretty.clone(),
        pretty.replace("  ", "\t"),
        pretty.replace('\n', "\r\n"),
        format!(" \n\t\r{BASE} \n\t\r"),
        format!("{BASE}x"),
        format!("{BASE}{BASE}"),
        format!("{BASE},"),
        format!("\u{feff}{BASE}"),
        format!("{BASE}\u{c}"),
        BASE.replacen(':', "\u{c}:", 1),
        BASE.replacen(':', "\u{a0}:", 1),
        BASE.replacen(',', " , ", 3),
        with_data(r#"{"a":true,"b":false,"c":null,"d":[],"e":{}}"#),
        with_data(r#"{"a":tru}"#),
        with_data(r#"{"a":nul}"#),
        with_data(r#"{"a":True}"#),
        with_data(r#"{"a":[1,]}"#),
        with_data(r#"{"a":1,}"#),
        with_data(r#"{"a" 1}"#),
        with_data(r#"{"a":1 "b":2}"#),
        with_data(r#"{1:2}"#),
        BASE.replace(r#","attempts":0}"#, "}"),
        BASE.replace(r#","attempts":0}"#, ""),
        BASE[..BASE.len() / 2].to_owned(),
        "[]".into(),
        "[1,2]".into(),
        "42".into(),
        "\"s\"".into(),
        "null".into(),
        "true".into(),
        "".into(),
        "  ".into(),
        "{}".into(),
    ];
    for raw in &cases {
        agree(raw.as_bytes());
    }
    assert!(agree(pretty.as_bytes()));
    assert_eq!(
        Message::parse(b"[1]", &Limits::default()).unwrap_err(),
        Rejection::NotAnObject
    );
}

#[test]
fn invalid_utf8_is_not_json_in_both() {
    let mut raw = BASE.as_bytes().to_vec();
    let at = BASE.find("CHF").unwrap();
    raw[at] = 0xff;
    assert!(!agree(&raw));
    raw[at] = 0xc3;
    raw[at + 1] = 0x28;
    assert!(!agree(&raw));
}

/// Bytes that matter to a JSON parser, for the mutations below.
const ALPHABET: &[u8] = b"{}[]\":,\\ \t\n0123456789.eE+-aeflnrstu\x01\x7f";

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3_000))]

    /// Random edits of a valid envelope: both decoders always give the same answer.
    #[test]
    fn mutated_envelopes_get_one_answer(
        edits in proptest::collection::vec((0usize..400, 0usize..ALPHABET.len(), 0u8..3), 1..6)
    ) {
        let mut raw = BASE.as_bytes().to_vec();
        for (at, byte, op) in edits {
            let at = at % (raw.len() + 1);
            let byte = ALPHABET[byte];
            match op {
                0 => raw.insert(at, byte),
                1 if at < raw.len() => { raw.remove(at); }
                _ if at < raw.len() => raw[at] = byte,
                _ => raw.push(byte),
            }
        }
        agree(&raw);
    }

    /// Any string as an id, escaped the way serde_json writes it: the same id back.
    #[test]
    fn any_id_reads_back_the_same(id in "\\PC{0,40}") {
        let quoted = serde_json::to_string(&id).unwrap();
        let raw = BASE.replace(r#""60a7c782-d326-426c-876e-7fc44dd0bb78""#, &quoted);
        prop_assert!(agree(raw.as_bytes()));
        let msg = Message::parse(raw.as_bytes(), &Limits::default()).unwrap();
        prop_assert_eq!(msg.id(), (!id.is_empty()).then_some(id.as_str()));
    }
}
