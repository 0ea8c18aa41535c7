//! TLS to the shared stores and to webhook receivers: rustls with its ring provider, trusting
//! the platform's root certificates or (stores) those of [`StoreOptions`](super::StoreOptions).

use std::sync::Arc;

#[cfg(any(feature = "postgres", feature = "events"))]
use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
#[cfg(feature = "postgres")]
pub(crate) use verify::{encrypted_only, verified};

/// The process's crypto provider; ring when the application installed none (installing it,
/// so that clients building their own configuration, as redis-rs does, find it too).
pub(crate) fn provider() -> Arc<CryptoProvider> {
    if let Some(provider) = CryptoProvider::get_default() {
        return Arc::clone(provider);
    }
    // Another thread may install one in between: whichever won is the default.
    let _ = rustls::crypto::ring::default_provider().install_default();
    CryptoProvider::get_default()
        .map(Arc::clone)
        .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()))
}

/// The platform's root certificates; finding none is an error, as nothing could be verified.
/// Read from disk once per process: every configuration build (each reload) shares them.
#[cfg(any(feature = "postgres", feature = "events"))]
pub(crate) fn native_roots() -> Result<Arc<RootCertStore>, NoNativeRoots> {
    static ROOTS: std::sync::OnceLock<Result<Arc<RootCertStore>, NoNativeRoots>> =
        std::sync::OnceLock::new();
    ROOTS
        .get_or_init(|| {
            let found = rustls_native_certs::load_native_certs();
            let mut roots = RootCertStore::empty();
            roots.add_parsable_certificates(found.certs);
            if roots.is_empty() {
                return Err(NoNativeRoots {
                    errors: found.errors.len(),
                });
            }
            Ok(Arc::new(roots))
        })
        .clone()
}

/// No usable root certificate on this system.
#[cfg(any(feature = "postgres", feature = "events"))]
#[derive(Debug, Clone, thiserror::Error)]
#[error("no root certificates found on this system ({errors} errors)")]
pub(crate) struct NoNativeRoots {
    /// How many certificate sources failed to load.
    errors: usize,
}

/// The client configurations of PostgreSQL's `sslmode`s (redis-rs builds its own).
#[cfg(feature = "postgres")]
mod verify {
    use std::sync::Arc;

    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

    use super::{native_roots, provider};
    use crate::idempotency::StoreError;

    fn failed(error: impl std::error::Error + Send + Sync + 'static) -> StoreError {
        StoreError(Box::new(error))
    }

    /// Encrypts and checks the server's certificate and name against `pem`'s certificates, or
    /// the platform's when `pem` is empty.
    pub(crate) fn verified(pem: &[u8]) -> Result<ClientConfig, StoreError> {
        Ok(ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(failed)?
            .with_root_certificates(roots(pem)?)
            .with_no_client_auth())
    }

    /// Encrypts without checking who answers (`sslmode=require`, as libpq does without a root
    /// certificate): protects against eavesdropping, not against an impostor.
    pub(crate) fn encrypted_only() -> Result<ClientConfig, StoreError> {
        let provider = provider();
        Ok(ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(failed)?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
            .with_no_client_auth())
    }

    fn roots(pem: &[u8]) -> Result<Arc<RootCertStore>, StoreError> {
        if pem.is_empty() {
            return native_roots().map_err(|none| {
                StoreError::message(format!("{none}; give them with `sslrootcert=PATH`"))
            });
        }
        let mut roots = RootCertStore::empty();
        for certificate in CertificateDer::pem_slice_iter(pem) {
            roots.add(certificate.map_err(failed)?).map_err(failed)?;
        }
        if roots.is_empty() {
            return Err(StoreError::message(
                "the root certificates given hold no PEM certificate",
            ));
        }
        Ok(Arc::new(roots))
    }

    /// Accepts any certificate, still checking that the server holds its key.
    #[derive(Debug)]
    struct AnyCertificate(Arc<CryptoProvider>);

    impl ServerCertVerifier for AnyCertificate {
        fn verify_server_cert(
            &self,
            _: &CertificateDer<'_>,
            _: &[CertificateDer<'_>],
            _: &ServerName<'_>,
            _: &[u8],
            _: UnixTime,
        ) -> Result<ServerCertVerified, rustls::Error> {
            Ok(ServerCertVerified::assertion())
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            certificate: &CertificateDer<'_>,
            signature: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            verify_tls12_signature(
                message,
                certificate,
                signature,
                &self.0.signature_verification_algorithms,
            )
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            certificate: &CertificateDer<'_>,
            signature: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            verify_tls13_signature(
                message,
                certificate,
                signature,
                &self.0.signature_verification_algorithms,
            )
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }
}
