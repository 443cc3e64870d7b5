//! The native fast path: the envelope decoded by sonic-rs's SIMD parser into a small
//! borrowed view, for envelopes that are valid.
//!
//! It only ever *accepts*. Whenever it cannot show that the reference decoder
//! (serde_json over the visitors in `view.rs`) would accept the same text with the
//! same fields, it answers `None` and the caller runs the reference, which then
//! decides, with its own typed [`Rejection`](super::Rejection) and message. So every
//! rejection is the reference's, and so is every rule that shows only on the way to
//! one:
//!
//! - nesting: the fast path follows containers [`FAST_DEPTH`] levels deep only
//!   (sonic-rs's own limit is 255), far inside [`MAX_DEPTH`](super::MAX_DEPTH);
//!   anything deeper is the reference's, limit and all;
//! - escapes (`\u` digits, lone surrogates, ...): a text with any backslash goes to
//!   the reference, so every string the fast path reads is borrowed verbatim;
//! - numbers, literals, whitespace, trailing text: any sonic-rs error goes to the
//!   reference; payload numbers are parsed into values, not just skipped, so an
//!   out-of-range one (`1e400`, an error in both) cannot slip through as syntax;
//! - duplicate keys: the last one wins here too (a later `meta` replaces an earlier
//!   one whole);
//! - a validation failure (missing job, bad attempts, ...) or a `meta.id` that is
//!   neither a string nor `null`: the reference decides.
//!
//! `tests/decode_fast.rs` and the `decode` fuzz target check that this path and the
//! reference agree on everything the fast path accepts.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::view::Loose;
use super::{Message, SCHEMA_VERSION};

/// `Some` when the fast parser accepts `text` as a valid envelope; `None` means "ask
/// the reference decoder" (never "invalid").
#[inline]
pub(super) fn parse(text: &str) -> Option<Message<'_>> {
    if !screen(text.as_bytes()) {
        return None;
    }
    let mut view = View::default();
    let mut de = sonic_rs::Deserializer::from_str(text);
    TopSeed(&mut view).deserialize(&mut de).ok()?;
    de.end().ok()?;
    view.into_message(text)
}

/// A field value as far as the fast path cares: a borrowed string, an unsigned
/// integer, `null`, absent, or anything else (which sends the text to the reference).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
enum Field<'a> {
    #[default]
    Absent,
    Null,
    Str(&'a str),
    Unsigned(u64),
    Other,
}

/// What the fast path keeps of an envelope while it decodes.
#[derive(Debug, Default)]
struct View<'a> {
    job: Field<'a>,
    urn: Field<'a>,
    trace_id: Field<'a>,
    attempts: Field<'a>,
    data_is_object: bool,
    meta: Meta<'a>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Meta<'a> {
    is_object: bool,
    id: Field<'a>,
    schema_version: Field<'a>,
}

impl<'a> View<'a> {
    /// The reference's `Message::validate`, for the accepting outcome only: any
    /// envelope it would reject (or whose id it would keep as a non-string) is
    /// `None` here and goes to the reference, which then gives the reason.
    fn into_message(self, raw: &'a str) -> Option<Message<'a>> {
        let job = match (self.job, self.urn) {
            (Field::Absent, urn) => urn,
            (job, _) => job,
        };
        let job = match job {
            Field::Str(s) if !s.trim().is_empty() => s,
            _ => return None,
        };
        let meta = self.meta;
        if !meta.is_object || meta.schema_version != Field::Unsigned(SCHEMA_VERSION) {
            return None;
        }
        if !self.data_is_object {
            return None;
        }
        let trace_id = match self.trace_id {
            Field::Str(s) if !s.trim().is_empty() => s,
            _ => return None,
        };
        let attempts = match self.attempts {
            Field::Absent => 0,
            Field::Unsigned(n) => n,
            _ => return None,
        };
        let id = match meta.id {
            Field::Absent => Loose::Absent,
            Field::Null => Loose::Null,
            Field::Str(s) => Loose::Str(Cow::Borrowed(s)),
            _ => return None,
        };
        Some(Message {
            raw,
            job: Cow::Borrowed(job),
            trace_id: Cow::Borrowed(trace_id),
            attempts,
            id,
        })
    }
}

/// Reads a scalar the fast path uses; a container (at nesting `depth`) is walked
/// (numbers parsed, so an out-of-range one is an error) and reported as `Other`.
#[derive(Clone, Copy)]
struct FieldSeed(usize);

impl<'de> DeserializeSeed<'de> for FieldSeed {
    type Value = Field<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Field<'de>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for FieldSeed {
    type Value = Field<'de>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Field::Other)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Field::Other)
    }
    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Field::Unsigned(v))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Field::Other)
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Field::Str(v))
    }
    // A string that had to be copied (escapes): the screen keeps escapes out, but
    // should one come, the reference decides.
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(Field::Other)
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Field::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        Skip(self.0).visit_seq(seq).map(|_| Field::Other)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        Skip(self.0).visit_map(map).map(|_| Field::Other)
    }
}

/// Walks any value without keeping it; a container in it sits at nesting level
/// `.0` (the envelope is level 1). Scalars go through `deserialize_any`, so numbers
/// are parsed (an out-of-range float is an error, as in the reference); object keys
/// are read as strings (which the screen has kept free of escapes). A container
/// deeper than [`FAST_DEPTH`] is an error, so the reference decides.
#[derive(Clone, Copy)]
struct Skip(usize);

impl<'de> DeserializeSeed<'de> for Skip {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl Skip {
    fn enter<E: de::Error>(self) -> Result<Skip, E> {
        match self.0 <= FAST_DEPTH {
            true => Ok(Skip(self.0 + 1)),
            false => Err(E::custom("nested deeper than the fast path goes")),
        }
    }
}

impl<'de> Visitor<'de> for Skip {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let inner = self.enter()?;
        while seq.next_element_seed(inner)?.is_some() {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let inner = self.enter()?;
        while map.next_key::<IgnoredAny>()?.is_some() {
            map.next_value_seed(inner)?;
        }
        Ok(())
    }
}

/// The keys the fast path reads, matched on the decoded text.
enum TopKey {
    Job,
    Urn,
    TraceId,
    Data,
    Meta,
    Attempts,
    Other,
}

enum MetaKey {
    Id,
    SchemaVersion,
    Other,
}

macro_rules! key_enum {
    ($ty:ident, $expecting:literal, { $($text:literal => $variant:ident),* $(,)? }) => {
        impl<'de> de::Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct KeyVisitor;
                impl<'de> Visitor<'de> for KeyVisitor {
                    type Value = $ty;
                    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                        f.write_str($expecting)
                    }
                    fn visit_str<E>(self, v: &str) -> Result<$ty, E> {
                        Ok(match v {
                            $($text => $ty::$variant,)*
                            _ => $ty::Other,
                        })
                    }
                }
                d.deserialize_str(KeyVisitor)
            }
        }
    };
}

key_enum!(TopKey, "an envelope key", {
    "job" => Job,
    "urn" => Urn,
    "trace_id" => TraceId,
    "data" => Data,
    "meta" => Meta,
    "attempts" => Attempts,
});

key_enum!(MetaKey, "a meta key", {
    "id" => Id,
    "schema_version" => SchemaVersion,
});

/// Decodes the top-level object into the view it borrows (no large value moved
/// through the parser's return paths). Anything but an object is an error here.
struct TopSeed<'v, 'a>(&'v mut View<'a>);

impl<'de> DeserializeSeed<'de> for TopSeed<'_, 'de> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for TopSeed<'_, 'de> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a BabelQueue envelope object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let view = self.0;
        // Duplicate keys: the last one wins, as in the reference.
        while let Some(key) = map.next_key::<TopKey>()? {
            match key {
                TopKey::Job => view.job = map.next_value_seed(FieldSeed(2))?,
                TopKey::Urn => view.urn = map.next_value_seed(FieldSeed(2))?,
                TopKey::TraceId => view.trace_id = map.next_value_seed(FieldSeed(2))?,
                TopKey::Attempts => view.attempts = map.next_value_seed(FieldSeed(2))?,
                TopKey::Data => view.data_is_object = map.next_value::<IsObject>()?.0,
                TopKey::Meta => {
                    // A later `meta` replaces an earlier one whole.
                    view.meta = Meta::default();
                    map.next_value_seed(MetaSeed(&mut view.meta))?;
                }
                TopKey::Other => map.next_value_seed(Skip(2))?,
            }
        }
        Ok(())
    }
}

/// Whether a value is an object (walked either way).
struct IsObject(bool);

impl<'de> de::Deserialize<'de> for IsObject {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct IsObjectVisitor;
        impl<'de> Visitor<'de> for IsObjectVisitor {
            type Value = IsObject;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_bool<E>(self, _: bool) -> Result<IsObject, E> {
                Ok(IsObject(false))
            }
            fn visit_i64<E>(self, _: i64) -> Result<IsObject, E> {
                Ok(IsObject(false))
            }
            fn visit_u64<E>(self, _: u64) -> Result<IsObject, E> {
                Ok(IsObject(false))
            }
            fn visit_f64<E>(self, _: f64) -> Result<IsObject, E> {
                Ok(IsObject(false))
            }
            fn visit_str<E>(self, _: &str) -> Result<IsObject, E> {
                Ok(IsObject(false))
            }
            fn visit_unit<E>(self) -> Result<IsObject, E> {
                Ok(IsObject(false))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<IsObject, A::Error> {
                Skip(2).visit_seq(seq).map(|_| IsObject(false))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<IsObject, A::Error> {
                Skip(2).visit_map(map).map(|_| IsObject(true))
            }
        }
        d.deserialize_any(IsObjectVisitor)
    }
}

/// Decodes `meta` into the view; a `meta` that is not an object leaves
/// `is_object` false (and the envelope goes to the reference).
struct MetaSeed<'v, 'a>(&'v mut Meta<'a>);

impl<'de> DeserializeSeed<'de> for MetaSeed<'_, 'de> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for MetaSeed<'_, 'de> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("the meta object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let meta = self.0;
        meta.is_object = true;
        while let Some(key) = map.next_key::<MetaKey>()? {
            match key {
                MetaKey::Id => meta.id = map.next_value_seed(FieldSeed(3))?,
                MetaKey::SchemaVersion => {
                    meta.schema_version = map.next_value_seed(FieldSeed(3))?;
                }
                MetaKey::Other => map.next_value_seed(Skip(3))?,
            }
        }
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<(), A::Error> {
        Skip(2).visit_seq(seq)
    }
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
}

/// How deep the fast path follows containers (the envelope is level 1; `data`
/// and `meta` are 2). Deeper texts go to the reference, which allows up to
/// [`MAX_DEPTH`](super::MAX_DEPTH): this bounds the fast path's recursion well
/// inside the limit (so, whichever decoder runs, the depth rule is the reference's)
/// and keeps its stack use small even in unoptimised builds.
const FAST_DEPTH: usize = 16;

/// The texts the fast path may decide: no backslash anywhere (escapes are the
/// reference's to judge; escaped texts are rare).
#[inline]
fn screen(text: &[u8]) -> bool {
    !text.contains(&b'\\')
}

#[cfg(test)]
mod tests {
    use super::{FAST_DEPTH, parse, screen};
    use crate::envelope::{Limits, MAX_DEPTH, Message};

    const BASE: &str = r#"{"job":"urn:babel:orders:shipped","trace_id":"f10f5e1a-01ba-4956-9582-8a4511ed9ff8","data":{"order_id":1000000,"amount":143.18,"currency":"CHF","customer":"cus_915221"},"meta":{"id":"60a7c782-d326-426c-876e-7fc44dd0bb78","queue":"fulfilment","lang":"node","schema_version":1,"created_at":1749132727031},"attempts":0}"#;

    /// The fast path's answer, checked against the reference's where it accepts.
    fn fast(raw: &str) -> bool {
        let Some(msg) = parse(raw) else { return false };
        let reference = Message::parse_reference(raw.as_bytes(), &Limits::default())
            .unwrap_or_else(|e| {
                panic!("the fast path accepted what the reference rejects ({e}): {raw}")
            });
        assert_eq!(
            (msg.id(), msg.job(), msg.trace_id()),
            (reference.id(), reference.job(), reference.trace_id())
        );
        assert_eq!(msg.attempts(), reference.attempts());
        true
    }

    #[test]
    fn typical_envelopes_take_the_fast_path() {
        let pretty =
            serde_json::to_string_pretty(&serde_json::from_str::<serde_json::Value>(BASE).unwrap())
                .unwrap();
        let accepted = [
            BASE.to_owned(),
            pretty,
            BASE.replace(r#""job":"#, r#""urn":"#),
            BASE.replace(r#","attempts":0"#, ""),
            BASE.replace(r#""attempts":0"#, r#""attempts":7"#),
            BASE.replace(r#""60a7c782-d326-426c-876e-7fc44dd0bb78""#, "null"),
            BASE.replace(r#""id":"60a7c782-d326-426c-876e-7fc44dd0bb78","#, ""),
            BASE.replace(r#""60a7c782-d326-426c-876e-7fc44dd0bb78""#, r#""""#),
            BASE.replace("143.18", "1e300"),
            BASE.replace("CHF", "Fr. \u{e9}\u{1f600}"),
        ];
        for raw in &accepted {
            assert!(fast(raw), "not on the fast path: {raw}");
        }
    }

    #[test]
    fn everything_in_doubt_goes_to_the_reference() {
        let declined = [
            BASE.replace("60a7c782", r"\u0036a7c782"),
            BASE.replace("CHF", r"C\nHF"),
            BASE.replace("143.18", "1e400"),
            BASE.replace(
                "143.18",
                &format!("{}1{}", "[".repeat(130), "]".repeat(130)),
            ),
            BASE.replace(r#""attempts":0"#, r#""attempts":-1"#),
            BASE.replace(r#""attempts":0"#, r#""attempts":1.0"#),
            BASE.replace(r#""schema_version":1"#, r#""schema_version":2"#),
            BASE.replace(r#""60a7c782-d326-426c-876e-7fc44dd0bb78""#, "7"),
            BASE.replace(r#""job":"urn:babel:orders:shipped""#, r#""job":" ""#),
            BASE.replace(
                r#""trace_id":"f10f5e1a-01ba-4956-9582-8a4511ed9ff8""#,
                r#""trace_id":"""#,
            ),
            BASE.replace(r#""data":{"#, r#""data":[{"#)
                .replace(r#""cus_915221"}"#, r#""cus_915221"}]"#),
            BASE.replace(r#""meta":{"#, r#""meta":[{"#)
                .replace("1749132727031}", "1749132727031}]"),
            format!("{BASE}x"),
            format!("[{BASE}]"),
        ];
        for raw in &declined {
            assert!(!fast(raw), "decided on the fast path: {raw}");
        }
    }

    #[test]
    fn the_fast_path_follows_containers_to_its_depth_only() {
        let at = |levels: usize| {
            // `data` is level 2; `levels - 2` arrays inside it reach `levels`.
            let inner = format!("{}1{}", "[".repeat(levels - 2), "]".repeat(levels - 2));
            BASE.replace("143.18", &inner)
        };
        assert!(fast(&at(FAST_DEPTH)));
        assert!(!fast(&at(FAST_DEPTH + 1)));
        assert!(!fast(&at(MAX_DEPTH - 1)));
        // The reference still accepts what is too deep for the fast path.
        let deeper = at(FAST_DEPTH + 1);
        assert!(Message::parse(deeper.as_bytes(), &Limits::default()).is_ok());
        // Breadth is not depth.
        let wide = BASE.replace("143.18", &format!("[{}1]", "[1],".repeat(500)));
        assert!(fast(&wide));
    }

    #[test]
    fn the_screen_refuses_any_backslash() {
        assert!(!screen(br#"{"a":"\u0041"}"#));
        assert!(!screen(br#"{"a":"\\"}"#));
        assert!(screen(br#"{"a":"A"}"#));
        assert!(screen(b""));
    }
}
