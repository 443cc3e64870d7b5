//! The reference wasmtime host of the dedupe component: the runtime (loading and
//! calling the component), the store behind its `store` import, and the handlers
//! behind its `handler` import. The `bq-dedupe` binary (`main.rs`) is the CLI on top.

#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

pub mod engine;
pub mod exec;
pub mod handler;
mod host_store;
pub mod keep_alive;
pub mod runtime;
pub mod wit;

/// The embedded default store when `--store` is absent.
pub const DEFAULT_STORE: &str = "sqlite:.bq-dedupe/seen.db";

/// A store spec as it may be printed: a password in the URL's user info (or a
/// `password=` parameter) is replaced by `***`, so error messages and logs never
/// carry it.
pub fn shown_spec(spec: &str) -> String {
    let mut shown = spec.to_string();
    if let Some(scheme_end) = shown.find("://") {
        let rest = scheme_end + 3;
        let authority_end = shown[rest..]
            .find(['/', '?'])
            .map_or(shown.len(), |i| rest + i);
        let at = shown[rest..authority_end].rfind('@').map(|i| rest + i);
        if let Some((at, colon)) = at.and_then(|at| Some((at, rest + shown[rest..at].find(':')?))) {
            shown.replace_range(colon + 1..at, "***");
        }
    }
    if let Some(at) = shown.find("password=") {
        let start = at + "password=".len();
        let end = shown[start..].find('&').map_or(shown.len(), |i| start + i);
        shown.replace_range(start..end, "***");
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::shown_spec;

    #[test]
    fn passwords_in_store_specs_are_never_shown() {
        assert_eq!(
            shown_spec("redis://:s3cret@h:6379/0"),
            "redis://:***@h:6379/0"
        );
        assert_eq!(
            shown_spec("postgres://bq:s3cret@db:5432/app?table=t"),
            "postgres://bq:***@db:5432/app?table=t"
        );
        assert_eq!(
            shown_spec("postgres://db/app?user=bq&password=s3cret&x=1"),
            "postgres://db/app?user=bq&password=***&x=1"
        );
        assert_eq!(
            shown_spec("redis+cluster://h1:7000,h2:7001"),
            "redis+cluster://h1:7000,h2:7001"
        );
        assert_eq!(
            shown_spec("sqlite:.bq-dedupe/seen.db"),
            "sqlite:.bq-dedupe/seen.db"
        );
    }
}
