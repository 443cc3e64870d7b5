//! What the guard takes as a delivery's body: bytes, or text.

use std::borrow::Cow;
use std::rc::Rc;
use std::sync::Arc;

use super::{Limits, Message, Rejection};

/// A delivery's body: raw bytes (checked for UTF-8 when decoded) or text (a
/// `str` is UTF-8 already, so it is not checked again). Implemented for the
/// usual owners and borrows of both; the guard's methods take any of them.
pub trait Body {
    /// Decodes the body: [`Message::parse`] for bytes, [`Message::parse_str`] for text.
    fn decode(&self, limits: &Limits) -> Result<Message<'_>, Rejection>;

    /// The W3C `traceparent` and `tracestate` the transport carried beside the
    /// body, for the delivery's span (none by default; see
    /// `telemetry::WithTraceHeaders`).
    fn trace_headers(&self) -> (Option<&str>, Option<&str>) {
        (None, None)
    }

    /// The body's bytes as delivered, for telemetry to read what it can of a
    /// body that is not a valid envelope (empty by default).
    fn raw(&self) -> &[u8] {
        &[]
    }
}

impl Body for [u8] {
    fn decode(&self, limits: &Limits) -> Result<Message<'_>, Rejection> {
        Message::parse(self, limits)
    }
    fn raw(&self) -> &[u8] {
        self
    }
}

impl Body for str {
    fn decode(&self, limits: &Limits) -> Result<Message<'_>, Rejection> {
        Message::parse_str(self, limits)
    }
    fn raw(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl<const N: usize> Body for [u8; N] {
    fn decode(&self, limits: &Limits) -> Result<Message<'_>, Rejection> {
        Message::parse(self, limits)
    }
    fn raw(&self) -> &[u8] {
        self
    }
}

/// Each owner decodes as what it owns.
macro_rules! body_as_deref {
    ($($ty:ty),* $(,)?) => {$(
        impl Body for $ty {
            fn decode(&self, limits: &Limits) -> Result<Message<'_>, Rejection> {
                (**self).decode(limits)
            }
            fn raw(&self) -> &[u8] {
                (**self).raw()
            }
        }
    )*};
}

body_as_deref!(Vec<u8>, String, Cow<'_, [u8]>, Cow<'_, str>);

/// Each pointer decodes as what it points to.
macro_rules! body_through_pointer {
    ($($ptr:ident),*) => {$(
        impl<T: Body + ?Sized> Body for $ptr<T> {
            fn decode(&self, limits: &Limits) -> Result<Message<'_>, Rejection> {
                (**self).decode(limits)
            }
            fn trace_headers(&self) -> (Option<&str>, Option<&str>) {
                (**self).trace_headers()
            }
            fn raw(&self) -> &[u8] {
                (**self).raw()
            }
        }
    )*};
}

body_through_pointer!(Box, Rc, Arc);

impl<T: Body + ?Sized> Body for &T {
    fn decode(&self, limits: &Limits) -> Result<Message<'_>, Rejection> {
        (**self).decode(limits)
    }
    fn trace_headers(&self) -> (Option<&str>, Option<&str>) {
        (**self).trace_headers()
    }
    fn raw(&self) -> &[u8] {
        (**self).raw()
    }
}

impl<T: Body + ?Sized> Body for &mut T {
    fn decode(&self, limits: &Limits) -> Result<Message<'_>, Rejection> {
        (**self).decode(limits)
    }
    fn trace_headers(&self) -> (Option<&str>, Option<&str>) {
        (**self).trace_headers()
    }
    fn raw(&self) -> &[u8] {
        (**self).raw()
    }
}
