//! Turning a message's `meta.id` into the key a store sees.

use std::borrow::Cow;

/// Where a consumer's ids live in a shared store.
///
/// The default is the id verbatim, so a store can be shared with other BabelQueue
/// SDKs. A `prefix` (e.g. `"bq:idem:"`) separates applications; a `scope` (e.g.
/// `"billing"`) gives two handlers of the same message their own seen-sets. The id
/// itself is never changed: the store key is `prefix + id`, or
/// `prefix + scope + ":" + id` with a scope (one more U+001F before a key that
/// would start with one).
///
/// Scoped and unscoped consumers should not share one prefix: an unscoped id
/// `"billing:x"` would meet the scoped key of id `"x"`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeySpace {
    prefix: String,
    scope: Option<String>,
}

/// What a key that would start with it gets one more of (see [`KeySpace::key`]).
const ESCAPE: char = '\u{1f}';

/// A scope that would make two different ids share a key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid key scope {}: it must be non-empty and contain no ':'", crate::envelope::quoted(.0))]
pub struct InvalidScope(pub String);

impl KeySpace {
    /// Keys are ids verbatim.
    pub fn new() -> Self {
        Self::default()
    }

    /// Prepends `prefix` to every key.
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Keeps this consumer's ids apart from other consumers of the same messages.
    pub fn with_scope(mut self, scope: impl Into<String>) -> Result<Self, InvalidScope> {
        let scope = scope.into();
        if scope.is_empty() || scope.contains(':') {
            return Err(InvalidScope(scope));
        }
        self.scope = Some(scope);
        Ok(self)
    }

    /// The store key for `id` (borrowed when there is nothing to add).
    ///
    /// A key that would start with U+001F gets one more: the fingerprint
    /// records are U+001F `fp:` + key, so an id shaped like one (only a
    /// hostile producer sends one) would be read as another id's record and
    /// skipped unrun. No real id starts with it; a peer SDK, which keeps such
    /// an id as it is, does not dedupe it with us.
    pub fn key<'a>(&self, id: &'a str) -> Cow<'a, str> {
        let key = match &self.scope {
            None if self.prefix.is_empty() => Cow::Borrowed(id),
            None => Cow::Owned(format!("{}{id}", self.prefix)),
            Some(scope) => Cow::Owned(format!("{}{scope}:{id}", self.prefix)),
        };
        if key.starts_with(ESCAPE) {
            let mut escaped = String::from(ESCAPE);
            escaped.push_str(&key);
            return Cow::Owned(escaped);
        }
        key
    }

    /// The id a store key was made from, if it belongs to this key space.
    pub fn id_of<'k>(&self, key: &'k str) -> Option<&'k str> {
        // Every key that starts with U+001F is an escaped one ([`KeySpace::key`]).
        let key = key.strip_prefix(ESCAPE).unwrap_or(key);
        let rest = key.strip_prefix(self.prefix.as_str())?;
        match &self.scope {
            None => Some(rest),
            Some(scope) => rest.strip_prefix(scope.as_str())?.strip_prefix(':'),
        }
    }

    /// [`KeySpace::id_of`] for an owned key, reusing its buffer: no allocation
    /// (with no prefix and no scope the key is the id itself).
    pub fn into_id(&self, mut key: String) -> Option<String> {
        let start = key.len() - self.id_of(&key)?.len();
        key.drain(..start);
        Some(key)
    }
}
