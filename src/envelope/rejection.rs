//! Why an envelope is refused: one typed reason per rule.

/// A delivery that is not a usable BabelQueue envelope (a poison message).
///
/// Each variant is one rule of `accepts()`; the message text is stable enough to log
/// and to compare in tests.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Rejection {
    /// The body is not JSON (or not UTF-8).
    #[error("not JSON: {0}")]
    NotJson(String),
    /// The body is JSON but not an object.
    #[error("the envelope is not a JSON object")]
    NotAnObject,
    /// The body is larger than [`Limits::max_bytes`](crate::envelope::Limits::max_bytes).
    #[error("the envelope is {size} bytes, over the {limit}-byte limit")]
    TooLarge {
        /// The body's size in bytes.
        size: usize,
        /// The limit in bytes.
        limit: usize,
    },
    /// Arrays/objects nested [`MAX_DEPTH`](crate::envelope::MAX_DEPTH) levels
    /// deep or more (the envelope itself level 1).
    #[error("the envelope nests {limit} levels deep or more (the envelope itself is level 1)")]
    TooDeep {
        /// The deepest nesting allowed.
        limit: usize,
    },
    /// Neither `job` nor `urn` is a non-blank string.
    #[error("no 'job' or 'urn': the message has no identity")]
    MissingJob,
    /// `meta` is absent or not an object.
    #[error("'meta' is missing or not an object")]
    MetaNotObject,
    /// `meta.schema_version` is not the integer 1.
    #[error(
        "meta.schema_version must be 1, the only version this consumer supports; found {found}"
    )]
    UnsupportedSchemaVersion {
        /// What `schema_version` held, as JSON (`nothing`: absent).
        found: String,
    },
    /// `data` is absent or not an object.
    #[error("'data' must be an object, found {found}")]
    DataNotObject {
        /// What `data` was, in short (`an array`, a string cut to 40
        /// characters, `null`...; `nothing`: absent).
        found: String,
    },
    /// `trace_id` is absent, not a string, or blank.
    #[error("'trace_id' is missing or blank")]
    BlankTraceId,
    /// `attempts` is present but not a non-negative integer.
    #[error("'attempts' must be a non-negative integer, found {found}")]
    BadAttempts {
        /// What `attempts` held, as JSON.
        found: String,
    },
}

impl Rejection {
    /// A stable kebab-case code for the reason (`"not-json"`, `"too-deep"`, ...),
    /// shared with the WIT contract and the JS package.
    pub fn code(&self) -> &'static str {
        match self {
            Rejection::NotJson(_) => "not-json",
            Rejection::NotAnObject => "not-an-object",
            Rejection::TooLarge { .. } => "too-large",
            Rejection::TooDeep { .. } => "too-deep",
            Rejection::MissingJob => "missing-job",
            Rejection::MetaNotObject => "meta-not-object",
            Rejection::UnsupportedSchemaVersion { .. } => "unsupported-schema-version",
            Rejection::DataNotObject { .. } => "data-not-object",
            Rejection::BlankTraceId => "blank-trace-id",
            Rejection::BadAttempts { .. } => "bad-attempts",
        }
    }

    pub(crate) fn from_json_error(e: &serde_json::Error) -> Rejection {
        // serde_json has no public error codes for these; its messages are stable.
        let text = e.to_string();
        if text.starts_with("recursion limit exceeded") {
            Rejection::TooDeep {
                limit: super::MAX_DEPTH,
            }
        } else if text.starts_with("unexpected end of hex escape")
            || text.starts_with("lone leading surrogate")
        {
            // Its two surrogate errors: "unexpected end of hex escape" names none.
            Rejection::NotJson(text + " (an unpaired UTF-16 surrogate: no UTF-8 text holds one)")
        } else {
            Rejection::NotJson(text)
        }
    }
}
