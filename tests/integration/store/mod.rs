//! The storage contracts, one suite per trait ([`keys`], [`executions`], [`events`]), each a
//! set of checks written once against the trait and run against every engine: memory and file
//! always; PostgreSQL and Redis when `CARMY_TEST_POSTGRES_URL` and `CARMY_TEST_REDIS_URL` name
//! servers (`.ci/run` sets both). Each engine's own properties are in [`engines`]; a host's own
//! key store beside the in-memory engine in [`custom`].
//! Time is tokio's paused clock where the backend's clock allows it, the real clock elsewhere.

mod custom;
mod engines;
mod events;
mod executions;
mod keys;

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use carmy::ExecutionStatus;
use carmy::store::{
    FileStore, Fingerprint, IdempotencyKey, PostgresStore, RedisStore, StoredResponse,
};
use carmy_tests::{run_id, server_url};

pub(crate) const TTL: Duration = Duration::from_secs(60);
pub(crate) const LEASE: Duration = Duration::from_secs(60);

/// Keys of this run only: reruns and the backends' tests never see each other's records.
pub(crate) fn key(request_id: &str) -> IdempotencyKey {
    IdempotencyKey::new(format!("caller-{}", run_id()), request_id)
}

pub(crate) fn fingerprint(tool: &str, byte: u8) -> Fingerprint {
    Fingerprint::new(tool, [byte; 32])
}

pub(crate) fn response(execution_id: &str) -> StoredResponse {
    StoredResponse::new(
        execution_id,
        ExecutionStatus::Completed,
        None,
        None,
        Bytes::from(format!("{{\"execution_id\":\"{execution_id}\"}}")),
    )
}

/// `response(execution_id)` with another body.
pub(crate) fn response_with_body(execution_id: &str, body: Bytes) -> StoredResponse {
    let mut response = response(execution_id);
    response.body = body;
    response
}

/// The real clock, for backends whose records follow it.
pub(crate) async fn sleep(duration: Duration) {
    tokio::time::sleep(duration).await;
}

/// A store file of this run, deleted when dropped.
pub(crate) struct TempFile(pub(crate) PathBuf);

impl TempFile {
    pub(crate) fn new(name: &str) -> Self {
        TempFile(std::env::temp_dir().join(format!("carmy-{}-{name}.redb", run_id())))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

pub(crate) async fn file_store(file: &TempFile) -> FileStore {
    FileStore::open(&file.0)
        .await
        .expect("the store file opens")
}

/// The engine of `CARMY_TEST_POSTGRES_URL`, if it is set.
pub(crate) async fn postgres_store() -> Option<PostgresStore> {
    let url = server_url("CARMY_TEST_POSTGRES_URL")?;
    Some(
        PostgresStore::connect(&url).await.unwrap_or_else(|error| {
            panic!("CARMY_TEST_POSTGRES_URL={url} is unreachable: {error}")
        }),
    )
}

/// The engine of `CARMY_TEST_REDIS_URL`, if it is set.
pub(crate) async fn redis_store() -> Option<RedisStore> {
    let url = server_url("CARMY_TEST_REDIS_URL")?;
    Some(
        RedisStore::connect(&url)
            .await
            .unwrap_or_else(|error| panic!("CARMY_TEST_REDIS_URL={url} is unreachable: {error}")),
    )
}
