//! The two envelope decoders agree: `Message::parse` (the scanner, falling back to
//! the reference) and `Envelope::decode` (the reference decoder alone, then the
//! owned tree). On every input below, on random mutations of a valid envelope and
//! on near-valid envelopes from a grammar, both accept with the same id, job, trace
//! id and attempts, or both reject with the same `Rejection`. The inputs sit on the
//! fast path's edges: nesting at the depth limit, out-of-range numbers, escapes,
//! duplicate keys, the job/urn alias, odd whitespace and trailing text.

use bq_dedupe::envelope::MAX_DEPTH;
use bq_dedupe::{Message, envelope::Envelope, envelope::Limits, envelope::Rejection};
use proptest::collection::vec;
use proptest::option::weighted;
use proptest::prelude::*;
use proptest::sample::select;
use proptest::strategy::ValueTree;
use proptest::string::string_regex;
use proptest::test_runner::TestRunner;

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
    // Just inside the limit is accepted, just past it is too-deep, in both:
    // 127 levels read, 128 refused (the envelope level 1, its data 2).
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
    // A `job` that is not a non-blank string gives way to `urn`.
    for fallback in &cases[2..5] {
        let urn = Message::parse(fallback.as_bytes(), &Limits::default()).unwrap();
        assert_eq!(urn.job(), "u");
    }
    assert_eq!(
        Message::parse(cases[1].as_bytes(), &Limits::default()).unwrap_err(),
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

// Near-valid envelopes from a grammar. Each generator below writes valid JSON and,
// at a rate of `noise` per mille at each of its sites, one of its typical defects
// instead; an envelope is generated at one noise level, from none to sloppy, so
// both the scanner's accepting path and the reference's rejections get plenty of
// cases. The values themselves vary too (blank jobs, odd schema versions and
// attempts, duplicate keys), defects or not.

/// A generated piece of JSON text.
type Text = BoxedStrategy<String>;

/// `good`, or `bad` at `noise` per mille (never at 0).
fn or_defect(
    noise: u32,
    good: impl Strategy<Value = String> + 'static,
    bad: impl Strategy<Value = String> + 'static,
) -> Text {
    if noise == 0 {
        return good.boxed();
    }
    prop_oneof![1000 - noise => good, noise => bad].boxed()
}

/// One of `options`.
fn one_of(options: &'static [&'static str]) -> Text {
    select(options).prop_map(str::to_owned).boxed()
}

/// A text matching `regex` (compiled once, here).
fn matching(regex: &str) -> Text {
    string_regex(regex).expect("a valid regex").boxed()
}

fn just(text: &str) -> Text {
    Just(text.to_owned()).boxed()
}

const GOOD_WS: &[&str] = &[" ", "\t", "\n", "\r\n", "  ", " \t\r\n"];
/// Whitespace to Unicode or to other parsers, not to JSON.
const BAD_WS: &[&str] = &[
    "\u{c}", "\u{b}", "\u{0}", "\u{a0}", "\u{85}", "\u{2028}", "\u{3000}", "\u{feff}",
];

/// Whitespace between tokens: mostly none.
fn ws(noise: u32) -> Text {
    let good = prop_oneof![5 => just(""), 1 => one_of(GOOD_WS)];
    or_defect(noise, good, one_of(BAD_WS))
}

const BAD_NUMBERS: &[&str] = &[
    "01",
    "00",
    "-01",
    "1.",
    ".5",
    "-",
    "1e",
    "1E+",
    "1e-",
    "+1",
    "--1",
    "1.e1",
    "1e1.5",
    "0x10",
    "1_0",
    "NaN",
    "Infinity",
    "-Infinity",
];

/// A number from JSON's grammar: integer parts up to 330 digits (around f64's
/// range), fractions, exponents of one to four digits.
fn number(noise: u32) -> Text {
    let integer = prop_oneof![
        29 => matching("-?(0|[1-9][0-9]{0,19})"),
        1 => matching("-?[1-9][0-9]{280,330}"),
    ];
    let fraction = prop_oneof![3 => just(""), 1 => matching(r"\.[0-9]{1,5}")];
    let exponent = prop_oneof![
        20 => just(""),
        4 => matching("[eE][+-]?[0-9]{1,2}"),
        1 => matching("[eE][+-]?[0-9]{3,4}"),
    ];
    let good = (integer, fraction, exponent).prop_map(|(i, f, e)| format!("{i}{f}{e}"));
    or_defect(noise, good, one_of(BAD_NUMBERS))
}

/// An `attempts` count: small, at the scanner's 19 digits, past them, or not a
/// count at all.
fn count(noise: u32) -> Text {
    prop_oneof![
        12 => matching("[0-9]"),
        2 => matching("[1-9][0-9]{1,17}"),
        1 => matching("[1-9][0-9]{18}"),
        1 => matching("[1-9][0-9]{19}"),
        1 => one_of(&["-0", "1.0", "0.0", "1e0", "-1", "-9223372036854775808", "01"]),
        1 => number(noise),
    ]
    .boxed()
}

fn literal(noise: u32) -> Text {
    or_defect(
        noise,
        one_of(&["true", "false", "null"]),
        one_of(&[
            "tru", "nul", "fals", "True", "NULL", "nulll", "truee", "t", "nan",
        ]),
    )
}

/// Pieces of a string's text: multibyte UTF-8, JSON's punctuation, Unicode spaces.
const STRING_PIECES: &[&str] = &[
    "a",
    "urn:babel:x",
    " ",
    "/",
    "'",
    "{",
    "}",
    "[",
    "]",
    ":",
    ",",
    "\u{7f}",
    "\u{80}",
    "\u{a0}",
    "\u{e9}",
    "\u{7ff}",
    "\u{800}",
    "\u{2028}",
    "\u{3000}",
    "\u{ffff}",
    "\u{1f600}",
    "\u{10ffff}",
    "aaaaaaaaaaaaaaaa",
];
/// Control characters (not JSON) and escapes, valid or not (the reference's to judge).
const STRING_DEFECTS: &[&str] = &[
    "\u{0}",
    "\u{1}",
    "\t",
    "\n",
    "\r",
    "\u{1f}",
    r"\n",
    r#"\""#,
    r"\\",
    r"\/",
    r"\u0041",
    r"\u00e9",
    r"\ud83d\ude00",
    r"\ud800",
    r"\udc00",
    r"\x",
    r"\u12",
    r"\",
];

/// A string, rarely with a control character, an escape or no closing quote.
fn string(noise: u32) -> Text {
    let piece = or_defect(noise, one_of(STRING_PIECES), one_of(STRING_DEFECTS));
    let close = or_defect(noise, just("\""), just(""));
    (vec(piece, 0..5), close)
        .prop_map(|(pieces, close)| format!("\"{}{close}", pieces.concat()))
        .boxed()
}

/// Names for unknown fields (in `meta`, `id` and `schema_version` are duplicates).
const FIELD_NAMES: &[&str] = &[
    "x",
    "",
    "n",
    "a b",
    "Job",
    "job ",
    "jo",
    "jobs",
    "trace-id",
    "id",
    "schema_version",
    "\u{e9}",
    "\u{1f600}",
];

/// A key, quoted; rarely bare, single-quoted, unterminated, or spelled with
/// `\u` escapes (valid, and the reference's to read).
fn key(name: impl Strategy<Value = String> + 'static, noise: u32) -> Text {
    name.prop_flat_map(move |name| {
        let escaped: String = name
            .encode_utf16()
            .map(|unit| format!(r"\u{unit:04x}"))
            .collect();
        let misspelled = vec![
            name.clone(),
            format!("'{name}'"),
            format!("\"{name}"),
            format!("\"{escaped}\""),
        ];
        or_defect(noise, Just(format!("\"{name}\"")), select(misspelled))
    })
    .boxed()
}

fn named(name: &str, noise: u32) -> Text {
    key(Just(name.to_owned()), noise)
}

/// `key: value`, the colon rarely missing or wrong.
fn member(key: Text, value: impl Strategy<Value = String> + 'static, noise: u32) -> Text {
    let colon = or_defect(noise, just(":"), one_of(&["", "::", "="]));
    (key, ws(noise), colon, ws(noise), value)
        .prop_map(|(key, a, colon, b, value)| format!("{key}{a}{colon}{b}{value}"))
        .boxed()
}

/// `items` between `open` and `close`, whitespace around each; rarely a comma
/// missing, doubled or trailing, or the closing bracket missing or wrong.
fn container(
    open: char,
    close: char,
    items: impl Strategy<Value = Vec<String>> + 'static,
    noise: u32,
) -> Text {
    let other = if close == '}' { ']' } else { '}' };
    let comma = or_defect(noise, just(","), one_of(&["", ",,", ";"]));
    let end = or_defect(
        noise,
        Just(close.to_string()),
        select(vec![String::new(), format!(",{close}"), other.to_string()]),
    );
    let gaps = (comma, ws(noise), ws(noise));
    let inner = ws(noise);
    items
        .prop_flat_map(move |items| {
            let n = items.len();
            (
                Just(items),
                vec(gaps.clone(), n),
                inner.clone(),
                end.clone(),
            )
        })
        .prop_map(move |(items, gaps, inner, end)| {
            let mut out = String::from(open);
            for (i, (item, (comma, before, after))) in items.iter().zip(gaps).enumerate() {
                if i > 0 {
                    out += &comma;
                }
                out += &before;
                out += item;
                out += &after;
            }
            out + &inner + &end
        })
        .boxed()
}

/// Any JSON value, containers nested up to three deep.
fn value(noise: u32) -> Text {
    let leaf = prop_oneof![3 => string(noise), 3 => number(noise), 2 => literal(noise)];
    leaf.prop_recursive(3, 16, 4, move |inner| {
        prop_oneof![
            container('[', ']', vec(inner.clone(), 0..4), noise),
            container(
                '{',
                '}',
                vec(member(key(one_of(FIELD_NAMES), noise), inner, noise), 0..4),
                noise
            ),
        ]
    })
    .boxed()
}

/// A value inside a run of arrays and objects, around the scanner's depth
/// (16) or serde_json's limit (`MAX_DEPTH`, 128).
fn deep(noise: u32) -> Text {
    let layers = prop_oneof![
        9 => vec(any::<bool>(), 12..=18),
        1 => vec(any::<bool>(), MAX_DEPTH - 6..=MAX_DEPTH + 2),
    ];
    (layers, value(noise))
        .prop_map(|(layers, inner)| {
            let mut out = String::new();
            for &array in &layers {
                out += if array { "[" } else { r#"{"k":"# };
            }
            out += &inner;
            for &array in layers.iter().rev() {
                out.push(if array { ']' } else { '}' });
            }
            out
        })
        .boxed()
}

/// A `job`, `urn` or `trace_id`: mostly a URN, sometimes any string, blank, or not
/// a string.
fn text_field(noise: u32) -> Text {
    prop_oneof![
        16 => matching("\"urn:[a-z]{1,8}:[a-z0-9.:-]{1,24}\""),
        3 => string(noise),
        1 => one_of(&["\"\"", "\" \"", "\"\u{a0}\"", "\"\u{3000}\"", "null", "1", "[]", "{}"]),
    ]
    .boxed()
}

/// `meta.id`: a string, `null`, a number, anything.
fn id(noise: u32) -> Text {
    prop_oneof![
        6 => matching("\"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}\""),
        2 => string(noise),
        1 => just("null"),
        1 => number(noise),
        1 => value(noise),
    ]
    .boxed()
}

fn schema_version() -> Text {
    prop_oneof![
        20 => just("1"),
        1 => one_of(&[
            "2", "0", "-1", "-0", "1.0", "1e0", "01", "\"1\"", "null", "18446744073709551617",
            "0000000000000000001",
        ]),
    ]
    .boxed()
}

/// `meta`: an object with `schema_version` and `id` (each sometimes absent, `id`
/// sometimes twice) among unknown fields, in any order; rarely not an object.
fn meta(noise: u32) -> Text {
    let members = (
        weighted(
            0.97,
            member(named("schema_version", noise), schema_version(), noise),
        ),
        weighted(0.85, member(named("id", noise), id(noise), noise)),
        vec(
            member(key(one_of(FIELD_NAMES), noise), value(noise), noise),
            0..3,
        ),
        weighted(0.05, member(named("id", noise), id(noise), noise)),
    )
        .prop_map(|(version, id, mut members, second_id)| {
            members.extend(version.into_iter().chain(id).chain(second_id));
            members
        })
        .prop_shuffle();
    prop_oneof![19 => container('{', '}', members, noise), 1 => value(noise)].boxed()
}

/// `data`: an object of numbers, strings, any values and deep ones; rarely not an
/// object.
fn data(noise: u32) -> Text {
    let field =
        prop_oneof![3 => number(noise), 2 => string(noise), 2 => value(noise), 1 => deep(noise)];
    let members = vec(member(key(one_of(FIELD_NAMES), noise), field, noise), 0..5);
    prop_oneof![19 => container('{', '}', members, noise), 1 => value(noise)].boxed()
}

/// A second member under an envelope field's name (the last one wins).
fn duplicate(noise: u32) -> Text {
    prop_oneof![
        2 => member(named("meta", noise), meta(noise), noise),
        1 => member(named("job", noise), text_field(noise), noise),
        1 => member(named("urn", noise), text_field(noise), noise),
        1 => member(named("trace_id", noise), text_field(noise), noise),
        1 => member(named("attempts", noise), count(noise), noise),
        1 => member(named("data", noise), data(noise), noise),
    ]
    .boxed()
}

/// An envelope at one noise level: its fields (`job` or `urn`, `trace_id`, `data`,
/// `meta`, maybe `attempts`), unknown ones and maybe a duplicate, shuffled; then
/// rarely something after it.
fn envelope_at(noise: u32) -> Text {
    let job = prop_oneof![
        4 => member(named("job", noise), text_field(noise), noise),
        1 => member(named("urn", noise), text_field(noise), noise),
    ];
    let extra = prop_oneof![3 => value(noise), 1 => deep(noise)];
    let members = (
        job,
        member(named("trace_id", noise), text_field(noise), noise),
        member(named("data", noise), data(noise), noise),
        member(named("meta", noise), meta(noise), noise),
        weighted(0.75, member(named("attempts", noise), count(noise), noise)),
        vec(member(key(one_of(FIELD_NAMES), noise), extra, noise), 0..3),
        weighted(0.15, duplicate(noise)),
    )
        .prop_map(|(job, trace_id, data, meta, attempts, extras, duplicate)| {
            let mut members = vec![job, trace_id, data, meta];
            members.extend(attempts.into_iter().chain(extras).chain(duplicate));
            members
        })
        .prop_shuffle();
    let trailing = or_defect(
        noise,
        just(""),
        one_of(&[
            "x", "}", "]", ",", "{}", "1", "\"", "null", "\u{0}", "\u{c}", "\u{a0}",
        ]),
    );
    (
        ws(noise),
        container('{', '}', members, noise),
        ws(noise),
        trailing,
    )
        .prop_map(|(before, envelope, after, trailing)| before + &envelope + &after + &trailing)
        .boxed()
}

/// Envelopes from clean (no defects; most are accepted) to sloppy.
fn envelope() -> Text {
    prop_oneof![
        3 => envelope_at(0),
        2 => envelope_at(2),
        2 => envelope_at(8),
        1 => envelope_at(30),
    ]
    .boxed()
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 3_000,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Envelopes from the grammar: both decoders always give the same answer.
    #[test]
    fn generated_envelopes_get_one_answer(raw in envelope()) {
        agree(raw.as_bytes());
    }
}

/// The grammar is no all-rejects (or all-accepts) generator: from a fixed seed,
/// a fair share of both.
#[test]
fn the_envelope_grammar_gives_both_answers() {
    const SAMPLES: usize = 500;
    let envelopes = envelope();
    let mut runner = TestRunner::deterministic();
    let accepted = (0..SAMPLES)
        .filter(|_| {
            let raw = envelopes.new_tree(&mut runner).unwrap().current();
            agree(raw.as_bytes())
        })
        .count();
    let rejected = SAMPLES - accepted;
    assert!(
        accepted * 20 >= SAMPLES && rejected * 20 >= SAMPLES,
        "{accepted} of {SAMPLES} accepted, {rejected} rejected"
    );
}
