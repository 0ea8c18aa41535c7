//! The Redis engine's idempotency records: one hash per key, hash-tagged to one cluster slot.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;

use super::{Inner, RedisStore, failed, millis};
use crate::store::record::{Found, Stored, reserve_within, within};
use crate::store::{Fingerprint, Finish, IdempotencyKey, KeyStore, Reservation, StoreError};

/// The record's key; the length prefix keeps `caller` and `request_id` apart whatever they
/// contain.
fn record_key(key: &IdempotencyKey) -> String {
    format!(
        "carmy:idempotency:{{{}:{}:{}}}",
        key.caller().len(),
        key.caller(),
        key.request_id()
    )
}

impl Inner {
    async fn reserve_key(
        &self,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        execution_id: &str,
        lease: Duration,
        ttl: Duration,
    ) -> Result<Reservation, StoreError> {
        let reply: Vec<Option<Vec<u8>>> = self
            .reserve
            .key(record_key(key))
            .arg(execution_id)
            .arg(&*fingerprint.tool)
            .arg(fingerprint.digest.as_slice())
            .arg(millis(lease))
            .arg(millis(ttl))
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(failed)?;
        let mut fields = reply.into_iter();
        let mut next = || fields.next().flatten();
        let text = |bytes: Option<Vec<u8>>| -> Result<String, StoreError> {
            String::from_utf8(bytes.unwrap_or_default())
                .map_err(|_| StoreError::message("unreadable idempotency record: not UTF-8"))
        };
        if next().as_deref() == Some(b"reserved") {
            return Ok(Reservation::Reserved);
        }
        let tool = text(next())?;
        let digest = next().unwrap_or_default();
        let execution_id = text(next())?;
        let state = text(next())?;
        let running_ms: u64 = text(next())?.parse().unwrap_or(0);
        let (status, category, code, body) = (next(), next(), next(), next());
        let response = match (status, body) {
            (Some(status), Some(body)) => Some(Stored {
                status: text(Some(status))?,
                category: category.map(|name| text(Some(name))).transpose()?,
                code: code.map(|code| text(Some(code))).transpose()?,
                body,
            }),
            _ => None,
        };
        Found {
            tool,
            digest,
            execution_id,
            state,
            running_for: Duration::from_millis(running_ms),
            response,
        }
        .reservation(fingerprint)
    }

    async fn finish_key(
        &self,
        key: &IdempotencyKey,
        finish: Finish<'_>,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let (state, stored) = Stored::of(finish);
        let mut invocation = self.finish.key(record_key(key));
        invocation
            .arg(&**finish.execution_id())
            .arg(state)
            .arg(millis(ttl));
        if let Some(stored) = &stored {
            invocation
                .arg(&stored.status)
                .arg(stored.category.as_deref().unwrap_or(""))
                .arg(stored.code.as_deref().unwrap_or(""))
                .arg(stored.body.as_slice());
        }
        let _: i64 = invocation
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(failed)?;
        Ok(())
    }

    async fn release_key(
        &self,
        key: &IdempotencyKey,
        execution_id: &str,
    ) -> Result<(), StoreError> {
        let _: i64 = self
            .release
            .key(record_key(key))
            .arg(execution_id)
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(failed)?;
        Ok(())
    }
}

impl KeyStore for RedisStore {
    fn reserve<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        fingerprint: &'a Fingerprint,
        execution_id: &'a Arc<str>,
        lease: Duration,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Reservation, StoreError>> {
        let reserve = {
            let (inner, key, fingerprint, execution_id) = (
                Arc::clone(&self.inner),
                key.clone(),
                fingerprint.clone(),
                Arc::clone(execution_id),
            );
            async move {
                inner
                    .reserve_key(&key, &fingerprint, &execution_id, lease, ttl)
                    .await
            }
        };
        let (inner, key, execution_id, timeout) = (
            Arc::clone(&self.inner),
            key.clone(),
            Arc::clone(execution_id),
            self.timeout,
        );
        let undo = move || {
            let (inner, key, execution_id) =
                (Arc::clone(&inner), key.clone(), Arc::clone(&execution_id));
            async move { within(timeout, inner.release_key(&key, &execution_id)).await }
        };
        Box::pin(reserve_within(self.timeout, lease, reserve, undo))
    }

    fn finish<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        finish: Finish<'a>,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move { within(self.timeout, self.inner.finish_key(key, finish, ttl)).await })
    }

    fn release<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        execution_id: &'a str,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(within(
            self.timeout,
            self.inner.release_key(key, execution_id),
        ))
    }

    /// Nothing to do: Redis drops expired keys itself.
    fn purge_expired(&self) -> BoxFuture<'_, Result<usize, StoreError>> {
        Box::pin(std::future::ready(Ok(0)))
    }

    fn ping(&self) -> Option<BoxFuture<'_, Result<(), StoreError>>> {
        Some(self.answers())
    }
}
