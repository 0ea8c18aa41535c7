//! TLS to the shared stores and to webhook receivers: rustls with its ring provider, and the
//! platform's root certificates.

use std::sync::Arc;

#[cfg(any(feature = "postgres", feature = "events"))]
use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;

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
