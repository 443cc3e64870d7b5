//! The example worker (issue #4).
