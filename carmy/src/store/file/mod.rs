//! The file engine: an embedded database file (redb), one node, kept across restarts. Records
//! in [`keys`] (written through the group commit of [`commit`]), events in [`outbox`],
//! executions in this process's memory.

mod commit;
mod keys;
mod outbox;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redb::{Database, Durability, ReadTransaction, ReadableDatabase, WriteTransaction};

use self::commit::Committer;
use self::keys::{RECORDS, Table, purge};
use super::record::Cleanup;
use super::{ProcessExecutions, StoreError};

/// How often expired records are deleted.
const CLEANUP_EVERY: Duration = Duration::from_secs(60);

/// An engine in a redb file: idempotency records for a single node that must remember finished calls,
/// and calls interrupted by a crash, across restarts, without running a database server.
/// Every transition is durable before it is answered; transitions that arrive together share
/// one write transaction and its fsync (group commit). Only one process may open the file.
///
/// Event subscriptions, the outbox and the attempt logs (`protocol.md` §8) are kept in the file
/// too, in tables of their own: pending deliveries survive a restart, and a delivery claimed by
/// the process that died is claimed again once its lease passes.
///
/// Executions (`protocol.md` §9) are kept in this process's memory, bounded to 64 MiB like the
/// in-memory store's: the one process that owns the file answers for them, but they do not
/// survive a restart (the idempotency records do).
pub struct FileStore {
    database: Arc<Database>,
    /// The records' writes, committed in batches: concurrent calls share an fsync.
    committer: Committer,
    executions: ProcessExecutions,
    _cleanup: Cleanup,
}

/// The bytes of executions a file store keeps in memory.
const EXECUTION_BYTES: usize = 64 * 1024 * 1024;

impl std::fmt::Debug for FileStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileStore").finish_non_exhaustive()
    }
}

fn failed(error: impl Into<redb::Error>) -> StoreError {
    StoreError::new(error.into())
}

/// Milliseconds since the Unix epoch: records outlive the process, so `Instant` won't do.
fn now_ms() -> u64 {
    epoch_ms(SystemTime::now())
}

/// `time` in milliseconds since the Unix epoch (0 before it).
fn epoch_ms(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, millis)
}

/// The time `epoch_ms` milliseconds after the Unix epoch.
fn from_epoch_ms(epoch_ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(epoch_ms)
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

impl FileStore {
    /// Opens the store in the file at `path`, creating it if needed. Fails if the file cannot
    /// be opened (another process holds it, or it is not a store).
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let path = path.as_ref().to_owned();
        let database = blocking(move || {
            let database = Database::create(&path).map_err(failed)?;
            let transaction = database.begin_write().map_err(failed)?;
            transaction.open_table(RECORDS).map_err(failed)?;
            outbox::create_tables(&transaction)?;
            transaction.commit().map_err(failed)?;
            Ok(Arc::new(database))
        })
        .await?;
        let cleanup = {
            let database = Arc::downgrade(&database);
            Cleanup::every(CLEANUP_EVERY, move || {
                let database = database.upgrade();
                async move {
                    match database {
                        Some(database) => blocking(move || purge(&database)).await,
                        None => Ok(0),
                    }
                }
            })
        };
        Ok(FileStore {
            executions: ProcessExecutions::new(EXECUTION_BYTES),
            committer: Committer::start(Arc::clone(&database)).map_err(StoreError::new)?,
            database,
            _cleanup: cleanup,
        })
    }

    /// Runs `work` in a durable write transaction on a blocking thread; commits when it
    /// returns `Ok`.
    async fn transact<T: Send + 'static>(
        &self,
        work: impl FnOnce(&WriteTransaction) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.transact_as(Durability::Immediate, work).await
    }

    /// [`FileStore::transact`] with the given durability.
    async fn transact_as<T: Send + 'static>(
        &self,
        durability: Durability,
        work: impl FnOnce(&WriteTransaction) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let database = Arc::clone(&self.database);
        blocking(move || {
            let mut transaction = database.begin_write().map_err(failed)?;
            transaction
                .set_durability(durability)
                .map_err(StoreError::new)?;
            let result = work(&transaction)?;
            transaction.commit().map_err(failed)?;
            Ok(result)
        })
        .await
    }

    /// A durable write on the records' table, in a transaction it may share with concurrent
    /// ones (group commit); `work` may run more than once.
    async fn write<T: Send + 'static>(
        &self,
        work: impl FnMut(&mut Table<'_>) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.committer.write(work).await
    }

    /// Runs `work` in a read transaction on a blocking thread.
    async fn view<T: Send + 'static>(
        &self,
        work: impl FnOnce(&ReadTransaction) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let database = Arc::clone(&self.database);
        blocking(move || work(&database.begin_read().map_err(failed)?)).await
    }
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(StoreError::new)?
}

/// The encoding's version, first byte of everything the file keeps.
const FORMAT: u8 = 1;

/// How the file encodes what it keeps: the version byte, then little-endian numbers and
/// length-prefixed optional fields, in the order each kind of value fixes.
struct Encoder(Vec<u8>);

impl Encoder {
    fn new() -> Self {
        Encoder(vec![FORMAT])
    }

    fn number(&mut self, number: u64) {
        self.0.extend_from_slice(&number.to_le_bytes());
    }

    fn field(&mut self, bytes: Option<&[u8]>) {
        match bytes {
            Some(bytes) => {
                self.0.push(1);
                self.number(bytes.len() as u64);
                self.0.extend_from_slice(bytes);
            }
            None => self.0.push(0),
        }
    }

    fn optional_number(&mut self, number: Option<u64>) {
        self.field(
            number
                .map(u64::to_le_bytes)
                .as_ref()
                .map(<[u8; 8]>::as_slice),
        );
    }
}

/// Reads what [`Encoder`] wrote; every read is `None` on bytes it did not write.
struct Decoder<'a>(&'a [u8]);

impl<'a> Decoder<'a> {
    /// `None` for bytes this version did not write.
    fn new(bytes: &'a [u8]) -> Option<Self> {
        let (&format, rest) = bytes.split_first()?;
        (format == FORMAT).then_some(Decoder(rest))
    }

    fn number(&mut self) -> Option<u64> {
        let (head, tail) = self.0.split_at_checked(8)?;
        self.0 = tail;
        Some(u64::from_le_bytes(head.try_into().ok()?))
    }

    fn field(&mut self) -> Option<Option<&'a [u8]>> {
        let (&present, tail) = self.0.split_first()?;
        self.0 = tail;
        if present == 0 {
            return Some(None);
        }
        let length = usize::try_from(self.number()?).ok()?;
        let (value, tail) = self.0.split_at_checked(length)?;
        self.0 = tail;
        Some(Some(value))
    }

    fn text(&mut self) -> Option<Option<String>> {
        match self.field()? {
            Some(bytes) => Some(Some(String::from_utf8(bytes.to_vec()).ok()?)),
            None => Some(None),
        }
    }

    fn optional_number(&mut self) -> Option<Option<u64>> {
        match self.field()? {
            Some(bytes) => Some(Some(u64::from_le_bytes(bytes.try_into().ok()?))),
            None => Some(None),
        }
    }
}

// The executions are kept in this process, as the memory engine keeps them.
super::process_executions::kept_in_process!(FileStore);
