//! TLS to PostgreSQL, as libpq's `sslmode` asks for it: rustls client configurations (redis-rs
//! builds its own), and the connections of the pool and of the listener, encrypted or not.

use std::sync::Arc;

use deadpool_postgres::{Manager, ManagerConfig};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres::NoTls;
use tokio_postgres_rustls::MakeRustlsConnect;

use super::failed;
use super::listen::listen;
use crate::store::StoreError;
use crate::store::announcements::AnnouncedIds;
use crate::tls::{native_roots, provider};

/// Encrypts and checks the server's certificate and name against `pem`'s certificates, or
/// the platform's when `pem` is empty.
pub(super) fn verified(pem: &[u8]) -> Result<ClientConfig, StoreError> {
    Ok(ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(failed)?
        .with_root_certificates(roots(pem)?)
        .with_no_client_auth())
}

/// Encrypts without checking who answers (`sslmode=require`, as libpq does without a root
/// certificate): protects against eavesdropping, not against an impostor.
pub(super) fn encrypted_only() -> Result<ClientConfig, StoreError> {
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

/// Whether connections are encrypted (see [`PostgresStore::connect`](super::PostgresStore::connect)).
#[derive(Clone)]
pub(super) enum Tls {
    Off,
    On(MakeRustlsConnect),
}

impl Tls {
    pub(super) fn manager(
        &self,
        config: tokio_postgres::Config,
        manager_config: ManagerConfig,
    ) -> Manager {
        match self {
            Tls::Off => Manager::from_config(config, NoTls, manager_config),
            Tls::On(tls) => Manager::from_config(config, tls.clone(), manager_config),
        }
    }

    /// A connection of its own that listens for announced executions.
    pub(super) async fn listen(
        &self,
        config: &tokio_postgres::Config,
    ) -> Result<AnnouncedIds, StoreError> {
        match self {
            Tls::Off => listen(config, NoTls).await,
            Tls::On(tls) => listen(config, tls.clone()).await,
        }
    }
}
