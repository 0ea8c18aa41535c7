//! Subscription signing secrets, written `whsec_<base64>` as Standard Webhooks does.

use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

const PREFIX: &str = "whsec_";
/// Standard Webhooks' bounds on a secret's length: shorter is guessable, longer is pointless.
const LENGTHS: std::ops::RangeInclusive<usize> = 24..=64;
/// What [`SigningSecret::generate`] draws: as long as the HMAC-SHA256 output.
const GENERATED_LENGTH: usize = 32;

/// A subscription's signing key: the bytes behind `whsec_…`. `Debug` shows none of it; it is
/// never logged.
#[derive(Clone, PartialEq, Eq)]
pub struct SigningSecret(Box<[u8]>);

impl SigningSecret {
    /// A new secret of 32 bytes from the operating system's random number generator.
    ///
    /// # Panics
    ///
    /// If the operating system cannot give random bytes: no secret can be made safely then.
    pub fn generate() -> Self {
        let mut bytes = [0u8; GENERATED_LENGTH];
        if let Err(error) = getrandom::fill(&mut bytes) {
            panic!("the operating system gave no random bytes for a signing secret: {error}");
        }
        Self(Box::new(bytes))
    }

    /// A secret of these bytes (24 to 64 of them).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, SecretError> {
        if !LENGTHS.contains(&bytes.len()) {
            return Err(SecretError::Length(bytes.len()));
        }
        Ok(Self(bytes.into()))
    }

    /// Reads `whsec_` followed by the standard base64 of 24 to 64 bytes.
    pub fn parse(text: &str) -> Result<Self, SecretError> {
        let encoded = text.strip_prefix(PREFIX).ok_or(SecretError::Prefix)?;
        let bytes = STANDARD.decode(encoded).map_err(|_| SecretError::Base64)?;
        Self::from_bytes(&bytes)
    }

    /// The key of the HMAC.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The secret as shown once to whoever creates or rotates a subscription.
    pub fn to_whsec(&self) -> String {
        format!("{PREFIX}{}", STANDARD.encode(&self.0))
    }
}

impl fmt::Debug for SigningSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SigningSecret(…)")
    }
}

/// Why a text or bytes are not a signing secret; never echoes the secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SecretError {
    /// The text does not start with `whsec_`.
    #[error("a signing secret starts with `whsec_`")]
    Prefix,
    /// What follows `whsec_` is not standard base64.
    #[error("a signing secret is `whsec_` followed by standard base64 (with padding)")]
    Base64,
    /// The secret has too few or too many bytes.
    #[error("a signing secret has 24 to 64 bytes, not {0}")]
    Length(usize),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_secrets_are_32_random_bytes_and_read_back() {
        let secret = SigningSecret::generate();
        assert_eq!(secret.as_bytes().len(), 32);
        assert_ne!(secret, SigningSecret::generate());
        assert_eq!(SigningSecret::parse(&secret.to_whsec()).unwrap(), secret);
    }

    #[test]
    fn the_reference_secret_is_read() {
        let secret = SigningSecret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        assert_eq!(secret.as_bytes().len(), 24);
        assert_eq!(secret.to_whsec(), "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
    }

    #[test]
    fn lengths_outside_24_to_64_bytes_are_refused() {
        assert_eq!(
            SigningSecret::from_bytes(&[7; 23]),
            Err(SecretError::Length(23))
        );
        assert!(SigningSecret::from_bytes(&[7; 24]).is_ok());
        assert!(SigningSecret::from_bytes(&[7; 64]).is_ok());
        assert_eq!(
            SigningSecret::from_bytes(&[7; 65]),
            Err(SecretError::Length(65))
        );
        assert_eq!(SigningSecret::from_bytes(&[]), Err(SecretError::Length(0)));
        let too_short = format!("whsec_{}", STANDARD.encode([7; 23]));
        assert_eq!(
            SigningSecret::parse(&too_short),
            Err(SecretError::Length(23))
        );
        let too_long = format!("whsec_{}", STANDARD.encode([7; 65]));
        assert_eq!(
            SigningSecret::parse(&too_long),
            Err(SecretError::Length(65))
        );
    }

    #[test]
    fn malformed_texts_are_refused_without_echoing_them() {
        let encoded = STANDARD.encode([7; 32]);
        for (text, expected) in [
            (encoded.clone(), SecretError::Prefix),
            (format!("WHSEC_{encoded}"), SecretError::Prefix),
            (format!(" whsec_{encoded}"), SecretError::Prefix),
            (format!("whsec_{encoded} "), SecretError::Base64),
            (
                format!("whsec_{}", encoded.replace('=', "")),
                SecretError::Base64,
            ),
            ("whsec_not base64!".to_owned(), SecretError::Base64),
            ("whsec_".to_owned(), SecretError::Length(0)),
        ] {
            let error = SigningSecret::parse(&text).unwrap_err();
            assert_eq!(error, expected, "{text}");
            assert!(!error.to_string().contains(&encoded[..8]), "{error}");
        }
    }

    #[test]
    fn debug_shows_none_of_the_secret() {
        let secret = SigningSecret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        assert_eq!(format!("{secret:?}"), "SigningSecret(…)");
        let shown = format!("{secret:?} {:#?}", [&secret]);
        for piece in ["MfKQ9r8G", "KYqrTwjU", "PD8ILPZI", "o2LaLaSw"] {
            assert!(!shown.contains(piece), "{shown} shows {piece}");
        }
    }
}
