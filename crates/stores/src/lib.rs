//! Persistent and shared stores (work in progress).
