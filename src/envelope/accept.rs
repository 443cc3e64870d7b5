//! What the scanner (`scan.rs`) keeps of an envelope while it decodes, and the rule
//! that turns it into a [`Message`]: the reference's validation for the accepting
//! outcome only. Anything in doubt is `None`, and the reference decoder (`view.rs`)
//! then decides, rejection and all.

use std::borrow::Cow;

use super::view::Loose;
use super::{Message, SCHEMA_VERSION};

/// A field value as far as the scanner cares: a borrowed string, an unsigned
/// integer, `null`, absent, or anything else (which sends the text to the reference).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) enum Field<'a> {
    #[default]
    Absent,
    Null,
    Str(&'a str),
    Unsigned(u64),
    Other,
}

/// What the scanner keeps of an envelope while it decodes.
#[derive(Debug, Default)]
pub(super) struct View<'a> {
    pub(super) job: Field<'a>,
    pub(super) urn: Field<'a>,
    pub(super) trace_id: Field<'a>,
    pub(super) attempts: Field<'a>,
    pub(super) data_is_object: bool,
    pub(super) meta: Meta<'a>,
}

#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Meta<'a> {
    pub(super) is_object: bool,
    pub(super) id: Field<'a>,
    pub(super) schema_version: Field<'a>,
}

impl<'a> View<'a> {
    /// The reference's `Message::validate`, for the accepting outcome only: any
    /// envelope it would reject (or whose id it would keep as a non-string) is
    /// `None` here and goes to the reference, which then gives the reason.
    pub(super) fn into_message(self, raw: &'a str) -> Option<Message<'a>> {
        let usable = |field| match field {
            Field::Str(s) if !s.trim().is_empty() => Some(s),
            _ => None,
        };
        let job = usable(self.job).or_else(|| usable(self.urn))?;
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

/// How deep the scanner follows containers (the envelope is level 1; `data`
/// and `meta` are 2). Deeper texts go to the reference, which allows up to
/// [`MAX_DEPTH`](super::MAX_DEPTH): this bounds the scanner's recursion well
/// inside the limit (so, whichever decoder runs, the depth rule is the reference's)
/// and keeps its stack use small even in unoptimised builds.
pub(super) const FAST_DEPTH: usize = 16;
