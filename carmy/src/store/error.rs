//! The one error of every store.

use std::fmt;

/// A store failed (connection lost, timeout), or could not be opened. At request time it is
/// answered as a retryable `503`, never by running the tool without a record.
///
/// Its message carries the whole chain of causes (a TLS handshake fails *because* the
/// certificate names another host), so a log line of it says what went wrong. Opaque: a store
/// makes one with [`StoreError::new`] or [`StoreError::message`].
#[derive(Debug)]
pub struct StoreError(Box<dyn std::error::Error + Send + Sync>);

impl StoreError {
    /// The store failed with `error` (a driver's error, an I/O error).
    pub fn new(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        StoreError(Box::new(error))
    }

    /// An error that is only a message (a record the store cannot read, a bad URL).
    pub fn message(message: impl Into<String>) -> Self {
        StoreError(message.into().into())
    }

    /// The error the store failed with.
    #[cfg(feature = "redis")]
    pub(crate) fn into_source(self) -> Box<dyn std::error::Error + Send + Sync> {
        self.0
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "idempotency store error: {}", self.0)?;
        let mut source = self.0.source();
        while let Some(cause) = source {
            write!(f, ": {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}

impl std::error::Error for StoreError {}
