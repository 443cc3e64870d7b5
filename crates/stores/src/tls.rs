//! TLS for the network stores: which server certificates are trusted, in one
//! place. Redis hands a CA file's PEM to its client; PostgreSQL gets a rustls
//! configuration for its `sslmode` (libpq's meanings).

use bq_dedupe::StoreResult;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use crate::invalid;

#[cfg(feature = "postgres")]
pub(crate) use sslmode::{client_config, postgres_tls};

/// The PEM file of the CA certificates to trust, read whole and checked to hold
/// at least one certificate (a wrong path is an error now, not a handshake
/// failure later).
pub(crate) fn read_ca_file(path: &str) -> StoreResult<Vec<u8>> {
    let pem = std::fs::read(path)
        .map_err(|e| invalid(format!("cannot read the CA file {path:?}: {e}")))?;
    if ca_certificates(&pem).is_empty() {
        return Err(invalid(format!(
            "the CA file {path:?} holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
        )));
    }
    Ok(pem)
}

fn ca_certificates(pem: &[u8]) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_slice_iter(pem)
        .filter_map(Result::ok)
        .collect()
}

/// PostgreSQL's TLS: a rustls configuration for libpq's `sslmode` (Redis's
/// client builds its own from the CA file's PEM).
#[cfg(feature = "postgres")]
mod sslmode {
    use std::sync::Arc;

    use bq_dedupe::StoreResult;
    use postgres::config::SslMode;
    use rustls::client::WebPkiServerVerifier;
    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    use rustls::{
        CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
    };

    use super::{ca_certificates, invalid, read_ca_file};
    use crate::take_params;

    /// How much of the server's certificate is checked: libpq's `sslmode`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(crate) enum Verify {
        /// `require` (and `prefer`) without a CA file: encrypted, the server not
        /// authenticated (libpq's meaning; a CA file makes it `Chain`).
        Nothing,
        /// `verify-ca`: the chain leads to a trusted CA; the name is not checked.
        Chain,
        /// `verify-full`: the chain, and the certificate names the host connected to.
        ChainAndName,
    }

    // rustls 0.23.48 deprecates ring's provider (no post-quantum key exchange);
    // the other, aws-lc-rs, needs a C toolchain to build. Allowed here, so a user
    // crate that builds with `-D warnings` against a newer rustls still builds.
    #[allow(deprecated)]
    fn provider() -> Arc<CryptoProvider> {
        Arc::new(rustls::crypto::ring::default_provider())
    }

    /// The trusted roots: the CA file's certificates, or the platform's (which
    /// honour `SSL_CERT_FILE`).
    fn roots(ca: Option<&[u8]>) -> StoreResult<RootCertStore> {
        let mut roots = RootCertStore::empty();
        let certs = match ca {
            Some(pem) => ca_certificates(pem),
            None => rustls_native_certs::load_native_certs().certs,
        };
        let (added, _) = roots.add_parsable_certificates(certs);
        if added == 0 {
            return Err(invalid(match ca {
                Some(_) => "the CA file holds no usable certificate",
                None => "no trusted root certificates on this machine (give a CA file)",
            }));
        }
        Ok(roots)
    }

    /// A rustls client configuration checking what `verify` asks, against `ca` or
    /// the platform's roots.
    pub(crate) fn client_config(verify: Verify, ca: Option<&[u8]>) -> StoreResult<ClientConfig> {
        let provider = provider();
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid(format!("tls: {e}")))?;
        let chain = match verify {
            Verify::Nothing => None,
            Verify::Chain | Verify::ChainAndName => Some(
                WebPkiServerVerifier::builder_with_provider(Arc::new(roots(ca)?), provider.clone())
                    .build()
                    .map_err(|e| invalid(format!("tls: {e}")))?,
            ),
        };
        let verifier: Arc<dyn ServerCertVerifier> = match (verify, chain) {
            (Verify::ChainAndName, Some(webpki)) => webpki,
            (_, chain) => Arc::new(Relaxed {
                chain,
                algorithms: provider.signature_verification_algorithms,
            }),
        };
        Ok(builder
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth())
    }

    /// libpq's weaker modes. `verify-ca` (`chain`): the full check, except that a
    /// certificate for another name passes. `require` without a CA file (no
    /// `chain`): any certificate is accepted. Either way the handshake's signatures
    /// are checked, so the session is encrypted to whoever holds the certificate's
    /// key.
    #[derive(Debug)]
    struct Relaxed {
        chain: Option<Arc<WebPkiServerVerifier>>,
        algorithms: WebPkiSupportedAlgorithms,
    }

    impl ServerCertVerifier for Relaxed {
        fn verify_server_cert(
            &self,
            end_entity: &CertificateDer<'_>,
            intermediates: &[CertificateDer<'_>],
            server_name: &ServerName<'_>,
            ocsp: &[u8],
            now: UnixTime,
        ) -> Result<ServerCertVerified, rustls::Error> {
            let Some(chain) = &self.chain else {
                return Ok(ServerCertVerified::assertion());
            };
            match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
                Err(rustls::Error::InvalidCertificate(
                    CertificateError::NotValidForName
                    | CertificateError::NotValidForNameContext { .. },
                )) => Ok(ServerCertVerified::assertion()),
                other => other,
            }
        }
        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
        }
        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
        }
        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.algorithms.supported_schemes()
        }
    }

    // ---- PostgreSQL's sslmode ---------------------------------------------------

    /// The TLS a URL asks for, libpq's way: `sslmode` (`disable`, `allow`, `prefer`
    /// (the default), `require`, `verify-ca`, `verify-full`) and `sslrootcert` (a
    /// PEM file of the CAs to trust, or `system`: the platform's roots, and
    /// verify-full). Both are taken out of the URL, which goes on to the client
    /// without them.
    pub(crate) struct PostgresTls {
        /// `None`: the URL said nothing (the config's own parse stands: a
        /// key=value string's `sslmode`, or the default `prefer`).
        pub(crate) mode: Option<SslMode>,
        pub(crate) verify: Verify,
        pub(crate) ca: Option<Vec<u8>>,
        /// What the mode leaves unchecked, when it does not authenticate the server.
        pub(crate) note: Option<String>,
    }

    /// The URL's `sslmode` and `sslrootcert`, read as libpq 16 reads them, taken
    /// out of it: the URL the client gets, and the TLS it asked for.
    pub(crate) fn postgres_tls(url: &str) -> StoreResult<(String, PostgresTls)> {
        let (url, ours) = take_params(url, &["sslmode", "sslrootcert"])?;
        let mut asked: Option<String> = None;
        let mut root = None;
        for (name, value) in ours {
            if name == "sslmode" {
                asked = Some(value);
            } else {
                root = Some(value);
            }
        }
        // `sslrootcert=system` (libpq 16): the platform's roots, and verify-full;
        // a weaker mode beside it is refused, as libpq refuses it.
        if root.as_deref() == Some("system") {
            return match asked.as_deref() {
                None | Some("verify-full") => Ok((
                    url,
                    PostgresTls {
                        mode: Some(SslMode::Require),
                        verify: Verify::ChainAndName,
                        ca: None,
                        note: None,
                    },
                )),
                Some(weak) => Err(invalid(format!(
                    "postgres: sslmode={weak} may not be used with sslrootcert=system, which \
                 verifies the server's certificate and name against the platform's roots \
                 (libpq 16): use sslmode=verify-full, or sslrootcert=PATH"
                ))),
            };
        }
        let ca = root.as_deref().map(read_ca_file).transpose()?;
        // libpq: with a CA file, `require` checks the chain as `verify-ca` does.
        let unverified = if ca.is_some() {
            Verify::Chain
        } else {
            Verify::Nothing
        };
        let (mode, verify) = match asked.as_deref() {
            None => (None, unverified),
            Some("disable") => (Some(SslMode::Disable), Verify::Nothing),
            // `allow` tries plain first in libpq; TLS first when offered is safer.
            Some("allow" | "prefer") => (Some(SslMode::Prefer), unverified),
            Some("require") => (Some(SslMode::Require), unverified),
            // Any public CA's certificate for any name would pass: libpq refuses it too.
            Some("verify-ca") if ca.is_none() => {
                return Err(invalid(
                    "postgres: sslmode=verify-ca needs sslrootcert=PATH (the CA that signs the \
                 server's certificate); to trust the platform's roots use verify-full, \
                 which also checks the host name",
                ));
            }
            Some("verify-ca") => (Some(SslMode::Require), Verify::Chain),
            Some("verify-full") => (Some(SslMode::Require), Verify::ChainAndName),
            Some(other) => {
                return Err(invalid(format!(
                    "postgres: unknown sslmode {other:?} (use disable, allow, prefer, require, verify-ca or verify-full)"
                )));
            }
        };
        let named = asked.as_deref().unwrap_or("prefer (the default)");
        let note = match (asked.as_deref(), verify) {
        (Some("disable"), _) => {
            Some("sslmode=disable: plain text, the server not authenticated".into())
        }
        (None | Some("allow" | "prefer"), _) => Some(format!(
            "sslmode={named}: TLS only when the server offers it (plain text otherwise){}",
            if ca.is_some() {
                ""
            } else {
                ", the server not authenticated"
            }
        )),
        (Some("require"), Verify::Nothing) => Some(
            "sslmode=require: encrypted, the server not authenticated (add sslrootcert=PATH, or \
             use verify-full)"
                .into(),
        ),
        _ => None,
    };
        Ok((
            url,
            PostgresTls {
                mode,
                verify,
                ca,
                note,
            },
        ))
    }
}
