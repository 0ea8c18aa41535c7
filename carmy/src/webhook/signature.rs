//! The `webhook-signature` header of Standard Webhooks: HMAC-SHA256 over
//! `"{id}.{timestamp}.{body}"`, so a receiver knows the sender holds the secret and that the
//! id, time and body are as sent.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use super::SigningSecret;

/// The scheme of carmy's signatures (the only one Standard Webhooks defines for symmetric keys).
const VERSION: &str = "v1,";

/// `webhook-signature` for one attempt: `v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`
/// per secret, space-separated (two while a secret rotates).
pub fn sign(secrets: &[&SigningSecret], event_id: &str, timestamp: u64, body: &[u8]) -> String {
    let signatures: Vec<String> = secrets
        .iter()
        .map(|secret| {
            let tag = mac(secret, event_id, timestamp, body)
                .finalize()
                .into_bytes();
            format!("{VERSION}{}", STANDARD.encode(tag))
        })
        .collect();
    signatures.join(" ")
}

/// Whether one of the header's `v1,` signatures is `secret`'s over this message (constant
/// time). For receivers written in Rust; checking that `timestamp` is recent is theirs to do.
pub fn verify(
    secret: &SigningSecret,
    event_id: &str,
    timestamp: u64,
    body: &[u8],
    signature_header: &str,
) -> bool {
    signature_header
        .split(' ')
        .filter_map(|signature| signature.strip_prefix(VERSION))
        .filter_map(|encoded| STANDARD.decode(encoded).ok())
        .any(|tag| {
            mac(secret, event_id, timestamp, body)
                .verify_slice(&tag)
                .is_ok()
        })
}

/// The MAC of the signed content, `"{id}.{timestamp}.{body}"`, to finalize or to verify.
fn mac(secret: &SigningSecret, event_id: &str, timestamp: u64, body: &[u8]) -> Hmac<Sha256> {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(secret.as_bytes())
        .unwrap_or_else(|_| unreachable!("HMAC takes keys of every length"));
    mac.update(event_id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference_secret() -> SigningSecret {
        SigningSecret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap()
    }

    #[test]
    fn the_standard_webhooks_reference_vector() {
        let (id, timestamp, body) = (
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            br#"{"test": 2432232314}"#,
        );
        let signature = sign(&[&reference_secret()], id, timestamp, body);
        assert_eq!(signature, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
        assert!(verify(&reference_secret(), id, timestamp, body, &signature));
    }

    // The signatures below were computed, and the headers verified (or refused), by the Python
    // `standardwebhooks` 1.1.0 package from PyPI, the specification's reference library.
    const ID: &str = "evt_01JQ7Z8X4K2M3N5P6R7S8T9V0W";
    const TIMESTAMP: u64 = 1767225600;
    const BODY: &[u8] = br#"{"type":"execution.finished","timestamp":"2026-01-01T00:00:00Z","data":{"execution_id":"exe_1","tool":"place_order","status":"succeeded","caller":"anonymous"}}"#;
    const OLD_SIGNATURE: &str = "v1,YhEyXAoo+3LqGAQnmIHrQ+jMHS8bFVehEYQesyYHNik=";
    const NEW_SIGNATURE: &str = "v1,bmew9OJ9fgGEQJ0YQQAWPQc5YxtN43noz9PXD7O/90Q=";

    /// `whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=`
    fn old_secret() -> SigningSecret {
        SigningSecret::from_bytes(&(0..32).collect::<Vec<u8>>()).unwrap()
    }

    /// `whsec_ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8=`
    fn new_secret() -> SigningSecret {
        SigningSecret::from_bytes(&(32..64).collect::<Vec<u8>>()).unwrap()
    }

    #[test]
    fn a_signature_matches_the_python_reference_library() {
        assert_eq!(sign(&[&old_secret()], ID, TIMESTAMP, BODY), OLD_SIGNATURE);
        assert_eq!(
            old_secret().to_whsec(),
            "whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="
        );
    }

    #[test]
    fn a_rotating_subscription_signs_with_both_secrets_and_either_verifies() {
        let header = sign(&[&old_secret(), &new_secret()], ID, TIMESTAMP, BODY);
        assert_eq!(header, format!("{OLD_SIGNATURE} {NEW_SIGNATURE}"));
        assert!(verify(&old_secret(), ID, TIMESTAMP, BODY, &header));
        assert!(verify(&new_secret(), ID, TIMESTAMP, BODY, &header));
        let other = SigningSecret::from_bytes(&(64..96).collect::<Vec<u8>>()).unwrap();
        assert!(!verify(&other, ID, TIMESTAMP, BODY, &header));
    }

    #[test]
    fn a_tampered_message_is_refused() {
        let header = format!("{OLD_SIGNATURE} {NEW_SIGNATURE}");
        let tampered = String::from_utf8(BODY.to_vec())
            .unwrap()
            .replace("succeeded", "failed");
        assert!(!verify(
            &old_secret(),
            ID,
            TIMESTAMP,
            tampered.as_bytes(),
            &header
        ));
        assert!(!verify(&old_secret(), ID, TIMESTAMP + 1, BODY, &header));
        assert!(!verify(
            &old_secret(),
            "evt_other",
            TIMESTAMP,
            BODY,
            &header
        ));
    }

    #[test]
    fn malformed_headers_verify_nothing() {
        let bare = OLD_SIGNATURE.trim_start_matches("v1,");
        let truncated = &OLD_SIGNATURE[..OLD_SIGNATURE.len() - 4];
        for header in [
            "",
            " ",
            bare,
            &format!("v2,{bare}"),
            &format!("v1,{bare}x"),
            truncated,
        ] {
            assert!(
                !verify(&old_secret(), ID, TIMESTAMP, BODY, header),
                "{header}"
            );
        }
        let among_others = format!("v1a,{bare} v1,bm90IGEgc2lnbmF0dXJl  {OLD_SIGNATURE}");
        assert!(verify(&old_secret(), ID, TIMESTAMP, BODY, &among_others));
    }
}
