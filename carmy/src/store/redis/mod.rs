//! The Redis engine, shared by every replica that uses the same server: the connection and
//! the announcements heard on a pub/sub connection here, the Lua [`scripts`], and one file per
//! concern ([`keys`], [`executions`], [`outbox`]).

mod executions;
mod keys;
mod outbox;
mod scripts;

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ConnectionAddr, IntoConnectionInfo, RedisError, Script};
use tokio_util::task::AbortOnDropHandle;

use self::scripts::{
    BEGIN_EXECUTION, CANCEL_EXECUTION, CLAIM_DELIVERIES, DELETE_SUBSCRIPTION, END_EXECUTION,
    ENQUEUE_EVENT, FINISH, FINISH_ATTEMPT, READ_EXECUTION, RECORD_PROGRESS, RELEASE, RESERVE,
    SAVE_SUBSCRIPTION, SUBSCRIPTIONS,
};
use super::announcements::{AnnouncedIds, Announcements};
use super::record::within;
use super::{StoreError, StoreOptions};

/// How many command timeouts redis-rs waits for an answer before it fails the command itself.
/// carmy answers the caller after one; waiting longer lets a claim that lands late be undone.
const GIVE_UP_AFTER: u32 = 6;

/// The channel on which the scripts announce changes of executions (`PUBLISH`, message the
/// id).
const ANNOUNCEMENTS: &str = "carmy:executions";

/// An engine in Redis: idempotency records, so that replicas sharing the server never run one
/// request twice. Every transition is one Lua script on one hash, so no interleaving of replicas loses
/// a record; keys are hash-tagged (`carmy:idempotency:{…}`) so each lives in one cluster slot.
/// Redis expires records itself. Every call has the time limits of its [`StoreOptions`].
///
/// Records must survive a restart of Redis, or a retry after one runs again: give the server
/// persistence (`appendonly yes`, or `save` snapshots); a warning is logged at connect when
/// it has neither.
///
/// Changes of executions are announced with `PUBLISH` from the scripts and heard on one
/// pub/sub connection of its own, so other replicas stream and cancel them as they happen.
///
/// It keeps events too (`protocol.md` §8), under one hash tag (`carmy:outbox:{events}:…`, one
/// cluster slot): subscriptions in hashes indexed by creation time, the outbox as delivery
/// hashes and a sorted set by due time (claimed by one script, so replicas never share a
/// claim; due again when a dead replica's lease passes), and each subscription's attempt log
/// in a list.
pub struct RedisStore {
    inner: Arc<Inner>,
    timeout: Duration,
    announcements: Arc<Announcements>,
    _listener: AbortOnDropHandle<()>,
}

/// What a reservation's own task needs (see [`reserve_within`]).
struct Inner {
    connection: ConnectionManager,
    reserve: Script,
    finish: Script,
    release: Script,
    begin_execution: Script,
    record_progress: Script,
    end_execution: Script,
    read_execution: Script,
    cancel_execution: Script,
    save_subscription: Script,
    subscriptions: Script,
    delete_subscription: Script,
    enqueue_event: Script,
    claim_deliveries: Script,
    finish_attempt: Script,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore").finish_non_exhaustive()
    }
}

fn failed(error: RedisError) -> StoreError {
    StoreError::new(error)
}

/// Opens a managed connection to `url` with carmy's time limits and, for `rediss://`, TLS
/// trusting `options`' root certificates: for the store and the rate limiter alike.
pub(crate) async fn open(
    url: &str,
    options: &StoreOptions,
) -> Result<(ConnectionManager, redis::Client, StoreOptions), StoreError> {
    let (url, options) = options.clone().with_url(url)?;
    let client = client(&url, &options)?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(options.acquire_timeout))
        .set_response_timeout(Some(options.command_timeout * GIVE_UP_AFTER))
        .set_number_of_retries(2);
    let connection = within(options.acquire_timeout + options.command_timeout, async {
        ConnectionManager::new_with_config(client.clone(), config)
            .await
            .map_err(failed)
    })
    .await?;
    Ok((connection, client, options))
}

/// A client for `url`; over TLS (`rediss://`), with rustls trusting `options`' root
/// certificates, or the platform's.
fn client(url: &str, options: &StoreOptions) -> Result<redis::Client, StoreError> {
    let info = url.into_connection_info().map_err(failed)?;
    if !matches!(info.addr(), ConnectionAddr::TcpTls { .. }) {
        return redis::Client::open(info).map_err(failed);
    }
    crate::tls::provider();
    let root_cert =
        (!options.root_certificates.is_empty()).then(|| options.root_certificates.clone());
    redis::Client::build_with_tls(
        info,
        redis::TlsCertificates {
            client_tls: None,
            root_cert,
        },
    )
    .map_err(failed)
}

/// Subscribes to the announcements on a connection of its own: the announced execution ids,
/// until the connection ends.
async fn listen(client: redis::Client) -> Result<AnnouncedIds, StoreError> {
    let mut pubsub = client.get_async_pubsub().await.map_err(failed)?;
    pubsub.subscribe(ANNOUNCEMENTS).await.map_err(failed)?;
    let ids = pubsub
        .into_on_message()
        .filter_map(|message| std::future::ready(message.get_payload::<String>().ok()));
    Ok(ids.boxed())
}

/// Warns when the server keeps nothing across a restart (no append-only file, no snapshots):
/// a restart then forgets every record, and retries run again. Servers that refuse `CONFIG`
/// (managed services) are not second-guessed.
async fn check_persistence(connection: &mut ConnectionManager) {
    let setting = |name: &'static str| {
        let mut connection = connection.clone();
        async move {
            redis::cmd("CONFIG")
                .arg("GET")
                .arg(name)
                .query_async::<std::collections::HashMap<String, String>>(&mut connection)
                .await
                .map(|mut values| values.remove(name).unwrap_or_default())
        }
    };
    match (setting("appendonly").await, setting("save").await) {
        (Ok(appendonly), Ok(save)) if appendonly == "no" && save.trim().is_empty() => {
            tracing::warn!(
                "the Redis idempotency store has no persistence (appendonly no, save \"\"): a \
                 restart of Redis forgets every record, and retries of calls made before it run \
                 again; enable appendonly (or save snapshots) on the server"
            );
        }
        (Ok(_), Ok(_)) => {}
        (Err(error), _) | (_, Err(error)) => {
            tracing::debug!(%error, "could not read the Redis persistence settings");
        }
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
}

impl RedisStore {
    /// Connects to the server at `url` (`redis://host:port/db`, or `rediss://` for TLS).
    /// Fails if the server cannot be reached.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_with(url, StoreOptions::new()).await
    }

    /// Like [`RedisStore::connect`], with the time limits and certificates of `options`.
    pub async fn connect_with(url: &str, options: StoreOptions) -> Result<Self, StoreError> {
        let (mut connection, client, options) = open(url, &options).await?;
        within(options.command_timeout * 2, async {
            check_persistence(&mut connection).await;
            Ok(())
        })
        .await
        .unwrap_or_else(
            |error| tracing::debug!(%error, "could not read the Redis persistence settings"),
        );
        let announcements = Announcements::new(options.execution_recheck);
        let listen = move || -> BoxFuture<'static, Result<AnnouncedIds, StoreError>> {
            let client = client.clone();
            Box::pin(within(
                options.acquire_timeout + options.command_timeout,
                listen(client),
            ))
        };
        let listener = announcements.listen(listen().await?, listen);
        Ok(RedisStore {
            announcements,
            _listener: listener,
            inner: Arc::new(Inner {
                connection,
                reserve: Script::new(RESERVE),
                finish: Script::new(FINISH),
                release: Script::new(RELEASE),
                begin_execution: Script::new(BEGIN_EXECUTION),
                record_progress: Script::new(RECORD_PROGRESS),
                end_execution: Script::new(END_EXECUTION),
                read_execution: Script::new(READ_EXECUTION),
                cancel_execution: Script::new(CANCEL_EXECUTION),
                save_subscription: Script::new(SAVE_SUBSCRIPTION),
                subscriptions: Script::new(SUBSCRIPTIONS),
                delete_subscription: Script::new(DELETE_SUBSCRIPTION),
                enqueue_event: Script::new(ENQUEUE_EVENT),
                claim_deliveries: Script::new(CLAIM_DELIVERIES),
                finish_attempt: Script::new(FINISH_ATTEMPT),
            }),
            timeout: options.command_timeout,
        })
    }

    /// Whether the server answers, within the command timeout.
    fn answers(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(within(self.timeout, async move {
            redis::cmd("PING")
                .query_async::<()>(&mut self.inner.connection.clone())
                .await
                .map_err(failed)
        }))
    }
}
