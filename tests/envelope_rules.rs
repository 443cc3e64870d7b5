//! Each `accepts()` rule, with its typed reason, and the owned envelope round trip.

mod common;

use bq_dedupe::{Message, envelope::Envelope, envelope::Limits, envelope::Rejection};
use common::envelope;
use serde_json::{Value, json};

fn with(edit: impl FnOnce(&mut Value)) -> String {
    let mut env: Value = serde_json::from_str(&envelope("id-1")).unwrap();
    edit(&mut env);
    env.to_string()
}

fn verdict(raw: &str) -> Result<(), Rejection> {
    Message::parse_str(raw, &Limits::default()).map(|_| ())
}

#[test]
fn job_or_urn_must_be_a_non_blank_string() {
    assert_eq!(
        verdict(&with(|e| {
            e.as_object_mut().unwrap().remove("job");
        })),
        Err(Rejection::MissingJob)
    );
    assert_eq!(
        verdict(&with(|e| e["job"] = json!("  "))),
        Err(Rejection::MissingJob)
    );
    assert_eq!(
        verdict(&with(|e| e["job"] = json!(7))),
        Err(Rejection::MissingJob)
    );
    let alias = with(|e| {
        let job = e.as_object_mut().unwrap().remove("job").unwrap();
        e["urn"] = job;
    });
    assert_eq!(
        Message::parse_str(&alias, &Limits::default())
            .unwrap()
            .job(),
        "urn:babel:orders:created"
    );
    // A `job` that is not a non-blank string gives way to a usable `urn`, as
    // the docs say and the Python SDK does (it was poison, dead-lettered: a
    // trial); with neither usable, poison.
    for job in [json!(""), json!("  "), json!(7), json!(null), json!({})] {
        let raw = with(|e| {
            e["job"] = job.clone();
            e["urn"] = json!("urn:babel:orders:paid");
        });
        let message = Message::parse_str(&raw, &Limits::default());
        assert_eq!(message.unwrap().job(), "urn:babel:orders:paid", "{job}");
        let envelope = Envelope::decode(raw.as_bytes(), &Limits::default()).unwrap();
        assert_eq!(envelope.job, "urn:babel:orders:paid", "{job}");
        let blank = with(|e| {
            e["job"] = job.clone();
            e["urn"] = json!(" ");
        });
        assert_eq!(verdict(&blank), Err(Rejection::MissingJob), "{job}");
    }
}

#[test]
fn schema_version_must_be_the_integer_one() {
    for (v, found) in [
        (json!(2), "2"),
        (json!("1"), "\"1\""),
        (json!(1.0), "1.0"),
        (json!(null), "null"),
    ] {
        let raw = with(|e| e["meta"]["schema_version"] = v.clone());
        assert_eq!(
            verdict(&raw),
            Err(Rejection::UnsupportedSchemaVersion {
                found: found.into()
            }),
            "{v}"
        );
    }
    let absent = with(|e| {
        e["meta"].as_object_mut().unwrap().remove("schema_version");
    });
    assert_eq!(
        verdict(&absent),
        Err(Rejection::UnsupportedSchemaVersion {
            found: "nothing".into()
        })
    );
    assert_eq!(
        verdict(&with(|e| e["meta"] = json!("x"))),
        Err(Rejection::MetaNotObject)
    );
}

#[test]
fn data_must_be_an_object() {
    assert!(matches!(
        verdict(&with(|e| e["data"] = json!([1]))),
        Err(Rejection::DataNotObject { .. })
    ));
    assert!(matches!(
        verdict(&with(|e| {
            e.as_object_mut().unwrap().remove("data");
        })),
        Err(Rejection::DataNotObject { .. })
    ));
}

#[test]
fn trace_id_must_not_be_blank() {
    for t in [json!(""), json!(" \t"), json!(null), json!(5)] {
        assert_eq!(
            verdict(&with(|e| e["trace_id"] = t.clone())),
            Err(Rejection::BlankTraceId),
            "{t}"
        );
    }
}

#[test]
fn attempts_must_be_a_non_negative_integer() {
    for a in [json!(-1), json!(1.5), json!(true), json!("1")] {
        assert!(
            matches!(
                verdict(&with(|e| e["attempts"] = a.clone())),
                Err(Rejection::BadAttempts { .. })
            ),
            "{a}"
        );
    }
    let absent = with(|e| {
        e.as_object_mut().unwrap().remove("attempts");
    });
    assert_eq!(
        Message::parse_str(&absent, &Limits::default())
            .unwrap()
            .attempts(),
        0
    );
}

/// A body that starts with a UTF-8 byte order mark is not JSON (RFC 8259; the
/// Go, PHP and Python SDKs refuse it too), and the reason says what is there:
/// serde's "expected value at line 1 column 1" does not.
#[test]
fn a_byte_order_mark_is_named_in_the_rejection() {
    let raw = format!("\u{feff}{}", envelope("bom"));
    match verdict(&raw) {
        Err(Rejection::NotJson(why)) => assert!(why.contains("byte order mark"), "{why}"),
        other => panic!("expected NotJson, got {other:?}"),
    }
}

#[test]
fn every_rejection_has_a_distinct_stable_code() {
    let all = [
        Rejection::NotJson(String::new()),
        Rejection::NotAnObject,
        Rejection::TooLarge { size: 0, limit: 0 },
        Rejection::TooDeep { limit: 0 },
        Rejection::MissingJob,
        Rejection::MetaNotObject,
        Rejection::UnsupportedSchemaVersion {
            found: String::new(),
        },
        Rejection::DataNotObject {
            found: String::new(),
        },
        Rejection::BlankTraceId,
        Rejection::BadAttempts {
            found: String::new(),
        },
    ];
    let codes: std::collections::HashSet<_> = all.iter().map(Rejection::code).collect();
    assert_eq!(codes.len(), all.len());
}

#[test]
fn owned_envelope_preserves_unknown_fields_and_writes_job() {
    let raw = with(|e| {
        let job = e.as_object_mut().unwrap().remove("job").unwrap();
        e["urn"] = job;
        e["x_custom"] = json!({"keep": [1, 2]});
        e["meta"]["x_region"] = json!("eu");
        e["dead_letter"] = json!({"reason": "failed", "failed_at": 1, "original_queue": "q", "attempts": 3, "x": 1});
    });
    let env = Envelope::decode(raw.as_bytes(), &Limits::default()).unwrap();
    assert_eq!(env.job, "urn:babel:orders:created");
    assert_eq!(env.extra["x_custom"], json!({"keep": [1, 2]}));
    let out: Value = serde_json::from_str(&env.to_json()).unwrap();
    assert_eq!(out["job"], "urn:babel:orders:created");
    assert!(out.get("urn").is_none());
    assert_eq!(out["meta"]["x_region"], "eu");
    assert_eq!(out["dead_letter"]["x"], 1);
    assert_eq!(out["x_custom"]["keep"][1], 2);
    assert_eq!(out["data"]["order_id"], 1042);
}

/// Found by the fuzzer: without exact float parsing a payload number changed on
/// the way through the owned envelope.
#[test]
fn payload_floats_round_trip_exactly() {
    let raw = with(|e| {
        e["meta"]["created_at"] = serde_json::from_str("1.7494444444444445e+97").unwrap();
        e["data"]["ratio"] = serde_json::from_str("0.1").unwrap();
        e["data"]["tiny"] = serde_json::from_str("5e-324").unwrap();
    });
    let env = Envelope::decode(raw.as_bytes(), &Limits::default()).unwrap();
    let again = Envelope::decode(env.to_json().as_bytes(), &Limits::default()).unwrap();
    assert_eq!(env, again);
    assert!(
        env.to_json().contains("1.7494444444444445e+97"),
        "{}",
        env.to_json()
    );
}
