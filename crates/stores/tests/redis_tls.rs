//! `rediss://` on a Redis that speaks TLS only (`scripts/with-redis-tls.sh`, run
//! by `make test`, with a CA it makes): a certificate the platform does not trust
//! is refused with a clear error; trusted (the CA's PEM in `SSL_CERT_FILE`, read
//! by rustls's platform roots), the store works and dedupes.

mod common;

use bq_dedupe::{Guard, OutcomeKind};
use bq_dedupe_stores::AnyStore;
use common::*;

#[test]
fn rediss_refuses_an_untrusted_certificate_then_dedupes_once_the_ca_is_trusted() {
    let url = server_spec(server_of("redis", true));
    let ca = std::env::var("BQ_TEST_REDIS_TLS_CA").expect("BQ_TEST_REDIS_TLS_CA");
    let spec = format!("{url}?prefix={}", redis_prefix("tls"));
    // The only test of this binary: the environment is set before any other thread reads it.
    let untrusted = AnyStore::from_spec(&spec).map(drop).unwrap_err();
    assert!(
        untrusted.message.to_lowercase().contains("certificate"),
        "a certificate error: {untrusted}"
    );
    unsafe { std::env::set_var("SSL_CERT_FILE", &ca) };
    let guard = Guard::new(AnyStore::from_spec(&spec).expect("connects over TLS"));
    let body = envelope(&unique("tls"));
    for expected in [OutcomeKind::Ran, OutcomeKind::Skipped] {
        let outcome = ready(guard.process(body.as_str(), async |_| Ok::<(), String>(())));
        assert_eq!(outcome.kind(), expected, "{outcome:?}");
    }
}
