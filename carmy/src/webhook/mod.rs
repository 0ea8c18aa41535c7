//! Signed outbound webhooks (`protocol.md` §8), as Standard Webhooks defines them: the secrets,
//! the signature a receiver verifies (with the specification's official libraries, or
//! [`verify`] in Rust), and, behind the `events` feature, the client that makes each delivery
//! attempt, refusing addresses an outsider must not reach through carmy (the SSRF guard).
//! Which events are sent, to whom and when is the events engine's business.

#[cfg(feature = "events")]
mod deliver;
mod secret;
mod signature;
#[cfg(feature = "events")]
mod ssrf;

#[cfg(feature = "events")]
pub use deliver::{Attempt, AttemptOutcome, Deliverer, DeliveryPolicy};
pub use secret::{SecretError, SigningSecret};
pub use signature::{sign, verify};
#[cfg(feature = "events")]
pub use ssrf::{AllowedNetworks, Refusal, classify};
