//! The hot-path decoder: one borrowed pass over the JSON that keeps only what the
//! dedupe decision and validation need. Payload values are walked (so syntax and
//! nesting depth are checked) but never built into a `serde_json::Value` tree.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// What a scalar-or-container JSON value was, with strings borrowed where possible.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) enum Loose<'a> {
    /// The key was not present at all.
    #[default]
    Absent,
    Null,
    Bool(bool),
    Unsigned(u64),
    Signed(i64),
    Float(f64),
    Str(Cow<'a, str>),
    Array,
    Object,
}

impl Loose<'_> {
    /// A short description for error messages (`"2"`, `"a string"`, `"nothing"`).
    pub(crate) fn describe(&self) -> String {
        match self {
            Loose::Absent => "nothing".into(),
            Loose::Null => "null".into(),
            Loose::Bool(b) => b.to_string(),
            Loose::Unsigned(n) => n.to_string(),
            Loose::Signed(n) => n.to_string(),
            // serde_json's (ryu) formatting: core's float Display would add ~22 KB
            // to the wasm builds.
            Loose::Float(f) => {
                serde_json::Number::from_f64(*f).map_or_else(|| "NaN".into(), |n| n.to_string())
            }
            Loose::Str(s) => quoted(truncate(s, 40)),
            Loose::Array => "an array".into(),
            Loose::Object => "an object".into(),
        }
    }
}

/// A string in JSON quotes and escapes (not `{:?}`, whose Unicode tables would
/// add kilobytes to the wasm builds).
pub(crate) fn quoted(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

fn truncate(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// Walks any JSON value without keeping it. Unlike `serde::de::IgnoredAny` it goes
/// through `deserialize_any`, so serde_json's recursion limit applies to payloads too.
struct Skip;

impl<'de> Deserialize<'de> for Skip {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(SkipVisitor).map(|_| Skip)
    }
}

struct SkipVisitor;

impl<'de> Visitor<'de> for SkipVisitor {
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
        while seq.next_element::<Skip>()?.is_some() {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while map.next_key::<Skip>()?.is_some() {
            map.next_value::<Skip>()?;
        }
        Ok(())
    }
}

/// A loose value whose containers are skipped (depth-checked) rather than kept.
impl<'de> Deserialize<'de> for Loose<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(LooseVisitor)
    }
}

struct LooseVisitor;

impl<'de> Visitor<'de> for LooseVisitor {
    type Value = Loose<'de>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
        Ok(Loose::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(Loose::Signed(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Loose::Unsigned(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
        Ok(Loose::Float(v))
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Loose::Str(Cow::Borrowed(v)))
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Loose::Str(Cow::Owned(v.to_owned())))
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Loose::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        SkipVisitor.visit_seq(seq).map(|_| Loose::Array)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        SkipVisitor.visit_map(map).map(|_| Loose::Object)
    }
}

/// An object key, borrowed unless it contained escapes.
struct Key<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Loose::deserialize(d)? {
            Loose::Str(s) => Ok(Key(s)),
            _ => Err(de::Error::custom("object key is not a string")),
        }
    }
}

/// The fields of `meta` that the decision and validation read.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct MetaView<'a> {
    pub id: Loose<'a>,
    pub schema_version: Loose<'a>,
}

/// `meta` is either an object (fields kept) or something else (kind kept).
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) enum MetaField<'a> {
    #[default]
    Absent,
    Object(MetaView<'a>),
    Other(Loose<'a>),
}

impl<'de> Deserialize<'de> for MetaField<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(MetaVisitor)
    }
}

struct MetaVisitor;

impl<'de> Visitor<'de> for MetaVisitor {
    type Value = MetaField<'de>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("the meta object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut meta = MetaView::default();
        // Duplicate keys: the last one wins, as in JSON.parse, json.loads and serde_json::Value.
        while let Some(Key(key)) = map.next_key()? {
            match key.as_ref() {
                "id" => meta.id = map.next_value()?,
                "schema_version" => meta.schema_version = map.next_value()?,
                _ => map.next_value::<Skip>().map(|_| ())?,
            }
        }
        Ok(MetaField::Object(meta))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        LooseVisitor.visit_seq(seq).map(MetaField::Other)
    }
    fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
        Ok(MetaField::Other(Loose::Bool(v)))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(MetaField::Other(Loose::Signed(v)))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(MetaField::Other(Loose::Unsigned(v)))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
        Ok(MetaField::Other(Loose::Float(v)))
    }
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(MetaField::Other(Loose::Str(Cow::Borrowed(""))))
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(MetaField::Other(Loose::Null))
    }
}

/// The top-level fields the decision and validation read; everything else is walked
/// and dropped (the raw bytes stay with the message, so nothing is lost).
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct EnvelopeView<'a> {
    pub job: Loose<'a>,
    pub urn: Loose<'a>,
    pub trace_id: Loose<'a>,
    pub data: Loose<'a>,
    pub meta: MetaField<'a>,
    pub attempts: Loose<'a>,
}

/// The top level is either an object (a view) or not an object at all.
pub(crate) enum TopLevel<'a> {
    Object(EnvelopeView<'a>),
    NotAnObject,
}

impl<'de> Deserialize<'de> for TopLevel<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(TopVisitor)
    }
}

struct TopVisitor;

impl<'de> Visitor<'de> for TopVisitor {
    type Value = TopLevel<'de>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a BabelQueue envelope object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut view = EnvelopeView::default();
        while let Some(Key(key)) = map.next_key()? {
            match key.as_ref() {
                "job" => view.job = map.next_value()?,
                "urn" => view.urn = map.next_value()?,
                "trace_id" => view.trace_id = map.next_value()?,
                "data" => view.data = map.next_value()?,
                "meta" => view.meta = map.next_value()?,
                "attempts" => view.attempts = map.next_value()?,
                _ => map.next_value::<Skip>().map(|_| ())?,
            }
        }
        Ok(TopLevel::Object(view))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        SkipVisitor.visit_seq(seq).map(|_| TopLevel::NotAnObject)
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(TopLevel::NotAnObject)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(TopLevel::NotAnObject)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(TopLevel::NotAnObject)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(TopLevel::NotAnObject)
    }
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(TopLevel::NotAnObject)
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(TopLevel::NotAnObject)
    }
}
