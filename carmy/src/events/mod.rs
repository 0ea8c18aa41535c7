//! The events of an app (`protocol.md` §8): what happened becomes an event in the outbox, one
//! delivery per subscription that wants it, written before the action that caused it is
//! answered; a worker delivers them, signed, through the webhook client. No HTTP here:
//! `api::event_routes` is the adapter.

mod policy;
mod service;
mod worker;

pub(crate) use policy::{EventPolicy, EventType};
pub(crate) use service::{Events, NewSubscription, Page, SubscriptionChange, SubscriptionView};
pub(crate) use worker::{forward_changes, run as deliver_outbox};
