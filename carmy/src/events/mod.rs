//! Signed outbound event webhooks (`protocol.md` §8).
//!
//! Secrets and signatures follow the Standard Webhooks specification, so receivers verify
//! deliveries with its official libraries (or [`signature::verify`] in Rust). Behind the
//! `events` feature, a `Deliverer` makes the delivery attempts, refusing addresses that an
//! outsider must not reach through carmy (the `ssrf` guard).

#[cfg(feature = "events")]
mod deliver;
pub mod secret;
#[cfg(feature = "events")]
mod service;
#[cfg(feature = "events")]
mod settings;
pub mod signature;
#[cfg(feature = "events")]
pub mod ssrf;
#[cfg(feature = "events")]
mod worker;

#[cfg(feature = "events")]
pub use deliver::{Attempt, AttemptOutcome, Deliverer, DeliveryPolicy};
pub use secret::{SecretError, SigningSecret};
#[cfg(feature = "events")]
pub(crate) use service::{Events, NewSubscription, Page, SubscriptionChange, SubscriptionView};
#[cfg(feature = "events")]
pub(crate) use settings::{EventSettings, EventType};
#[cfg(feature = "events")]
pub use ssrf::{AllowedNetworks, Refusal};
#[cfg(feature = "events")]
pub(crate) use worker::{forward_changes, run as deliver_outbox};
