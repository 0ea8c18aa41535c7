//! The PostgreSQL engine, shared by every replica that uses the same database: the
//! connection pool and its TLS here, one file per concern ([`keys`], [`executions`],
//! [`outbox`]), the schema's [`migrations`], and the [`listen`]ing connection.

mod executions;
mod keys;
mod listen;
mod migrations;
mod outbox;
mod tls;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{ManagerConfig, Pool, RecyclingMethod, Runtime};
use futures_util::future::BoxFuture;
use tokio_postgres::config::SslMode;
use tokio_postgres_rustls::MakeRustlsConnect;
use tokio_util::task::AbortOnDropHandle;

use self::executions::PURGE_EXECUTIONS;
use self::keys::PURGE_BATCH;
use self::migrations::migrate;
use self::tls::Tls;
use super::announcements::{AnnouncedIds, Announcements};
use super::options::take_params;
use super::record::{Cleanup, within};
use super::{StoreError, StoreOptions};

/// How often each store deletes expired records, and how many per statement.
const CLEANUP_EVERY: Duration = Duration::from_secs(60);
const CLEANUP_BATCH: i64 = 1_000;

const POOL_SIZE: usize = 16;

/// An engine in PostgreSQL: idempotency records in a table, so that replicas sharing the
/// database never run one request twice. The reservation is one statement (`INSERT … ON CONFLICT DO NOTHING`, or
/// the takeover of an expired record), atomic across replicas;
/// expiry follows the server's clock; each store deletes expired records every minute.
///
/// The schema is created on connect by embedded, versioned migrations, applied under an
/// advisory lock. Every call has the time limits of its [`StoreOptions`]. Changes of executions
/// are announced with `NOTIFY` and heard on one connection of its own (`LISTEN`), so other
/// replicas stream and cancel them as they happen.
///
/// It keeps events too (`protocol.md` §8): subscriptions, the outbox (one row per event and
/// subscription, claimed with `FOR UPDATE SKIP LOCKED` so replicas share the work, due again
/// when a dead replica's lease passes) and the attempt log, in the tables of migration 3.
pub struct PostgresStore {
    pool: Pool,
    options: StoreOptions,
    announcements: Arc<Announcements>,
    _cleanup: Cleanup,
    _listener: AbortOnDropHandle<()>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("pool", &self.pool.status())
            .finish_non_exhaustive()
    }
}

fn failed(error: impl std::error::Error + Send + Sync + 'static) -> StoreError {
    StoreError::new(error)
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

impl PostgresStore {
    /// Connects to the database at `url` (`postgres://user@host:port/db`), applies the
    /// migrations, and starts the periodic cleanup. Fails if the database cannot be reached.
    ///
    /// TLS follows libpq's `sslmode`, with rustls: `disable` and `prefer` (the default) do not
    /// encrypt; `require` encrypts without checking the certificate; `verify-full` (and
    /// `verify-ca`, which rustls checks as strictly) checks the certificate and the host name
    /// against the platform's root certificates, or those of `sslrootcert=PATH`.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_with(url, StoreOptions::new()).await
    }

    /// Like [`PostgresStore::connect`], with time limits and certificates of `options`.
    pub async fn connect_with(url: &str, options: StoreOptions) -> Result<Self, StoreError> {
        Self::open(url, options, CLEANUP_EVERY).await
    }

    /// Like [`PostgresStore::connect`], deleting expired records every `interval`.
    pub async fn connect_with_cleanup(url: &str, interval: Duration) -> Result<Self, StoreError> {
        Self::open(url, StoreOptions::new(), interval).await
    }

    async fn open(
        url: &str,
        options: StoreOptions,
        interval: Duration,
    ) -> Result<Self, StoreError> {
        let (url, options) = options.with_url(url)?;
        let (url, mode) = take_params(&url, &["sslmode"]);
        let mode = mode.last().map_or("prefer", |(_, mode)| mode.as_str());
        let mut config = tokio_postgres::Config::from_str(&url).map_err(failed)?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(options.acquire_timeout);
        }
        let manager_config = ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        let tls = match mode {
            "disable" | "allow" | "prefer" => Tls::Off,
            "require" => {
                config.ssl_mode(SslMode::Require);
                Tls::On(MakeRustlsConnect::new(tls::encrypted_only()?))
            }
            "verify-ca" | "verify-full" => {
                config.ssl_mode(SslMode::Require);
                Tls::On(MakeRustlsConnect::new(tls::verified(
                    &options.root_certificates,
                )?))
            }
            other => {
                return Err(StoreError::message(format!(
                    "`sslmode={other}` in the store URL: expected disable, prefer, require, \
                     verify-ca or verify-full"
                )));
            }
        };
        let manager = tls.manager(config.clone(), manager_config);
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(options.acquire_timeout))
            .create_timeout(Some(options.acquire_timeout))
            .recycle_timeout(Some(options.acquire_timeout))
            .build()
            .map_err(failed)?;
        let mut client = pool.get().await.map_err(failed)?;
        within(options.command_timeout, async {
            migrate(&mut client).await.map_err(failed)
        })
        .await?;
        drop(client);
        let cleanup = {
            let pool = pool.clone();
            let timeout = options.command_timeout;
            Cleanup::every(interval, move || {
                let pool = pool.clone();
                async move { purge(&pool, timeout).await }
            })
        };
        let announcements = Announcements::new(options.execution_recheck);
        let listen = move || -> BoxFuture<'static, Result<AnnouncedIds, StoreError>> {
            let (config, tls) = (config.clone(), tls.clone());
            Box::pin(within(
                options.acquire_timeout + options.command_timeout,
                async move { tls.listen(&config).await },
            ))
        };
        let listener = announcements.listen(listen().await?, listen);
        Ok(PostgresStore {
            pool,
            options,
            announcements,
            _cleanup: cleanup,
            _listener: listener,
        })
    }

    /// Whether the database answers, within the command timeout.
    fn answers(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(within(self.options.command_timeout, async move {
            client(&self.pool)
                .await?
                .simple_query("SELECT 1")
                .await
                .map_err(failed)?;
            Ok(())
        }))
    }
}

/// A pooled connection; the pool's own time limits apply.
async fn client(pool: &Pool) -> Result<deadpool_postgres::Client, StoreError> {
    pool.get().await.map_err(failed)
}

/// Deletes every expired record, a batch per statement of at most `timeout`.
async fn purge(pool: &Pool, timeout: Duration) -> Result<usize, StoreError> {
    Ok(purge_with(pool, timeout, PURGE_BATCH).await?
        + purge_with(pool, timeout, PURGE_EXECUTIONS).await?)
}

/// Runs the batch deletion `sql` until a batch deletes fewer than a full one.
async fn purge_with(pool: &Pool, timeout: Duration, sql: &str) -> Result<usize, StoreError> {
    let client = client(pool).await?;
    let statement = within(timeout, async {
        client.prepare_cached(sql).await.map_err(failed)
    })
    .await?;
    let mut purged = 0;
    loop {
        let deleted = within(timeout, async {
            client
                .execute(&statement, &[&CLEANUP_BATCH])
                .await
                .map_err(failed)
        })
        .await?;
        purged += usize::try_from(deleted).unwrap_or(usize::MAX);
        if deleted < CLEANUP_BATCH.unsigned_abs() {
            return Ok(purged);
        }
    }
}
