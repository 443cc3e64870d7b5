//! How a store fails: a typed error with a stable code.

/// Result of a store operation.
pub type StoreResult<T> = Result<T, StoreError>;

/// What kind of failure a store reported (on the wire, its [`code`](Self::code)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StoreErrorKind {
    /// The backend could not be reached or did not answer; retrying may help.
    Unavailable,
    /// The store does not offer this operation (e.g. claims, TTL without a clock).
    Unsupported,
    /// The store refused the input (e.g. a key it cannot hold).
    Invalid,
    /// Anything else the backend reported.
    Internal,
}

impl StoreErrorKind {
    /// A stable kebab-case code, shared with the WIT contract.
    pub fn code(self) -> &'static str {
        match self {
            StoreErrorKind::Unavailable => "unavailable",
            StoreErrorKind::Unsupported => "unsupported",
            StoreErrorKind::Invalid => "invalid",
            StoreErrorKind::Internal => "internal",
        }
    }

    /// The kind whose [`code`](Self::code) this is.
    pub fn from_code(code: &str) -> Option<Self> {
        use StoreErrorKind::*;
        [Unavailable, Unsupported, Invalid, Internal]
            .into_iter()
            .find(|kind| kind.code() == code)
    }
}

/// A typed store failure. Stores never panic; they return this.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
#[error("store {}: {message}", kind.code())]
pub struct StoreError {
    /// What the backend said (on the wire, `error`).
    #[serde(rename = "error")]
    pub message: String,
    /// What kind of failure.
    pub kind: StoreErrorKind,
}

impl StoreError {
    /// A failure of `kind`.
    pub fn new(kind: StoreErrorKind, message: impl Into<String>) -> Self {
        StoreError {
            kind,
            message: message.into(),
        }
    }
    /// The backend could not be reached; retrying may help.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StoreErrorKind::Unavailable, message)
    }
    /// The store does not offer this operation.
    pub fn unsupported(message: impl Into<String>) -> Self {
        Self::new(StoreErrorKind::Unsupported, message)
    }
    /// Anything else the backend reported.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StoreErrorKind::Internal, message)
    }
    /// A backend failure: `Unavailable` when retrying may help, else `Internal`.
    pub fn backend(transient: bool, message: impl Into<String>) -> Self {
        let kind = if transient {
            StoreErrorKind::Unavailable
        } else {
            StoreErrorKind::Internal
        };
        Self::new(kind, message)
    }
}
