//! Records in an embedded database file (redb): one node, kept across restarts.

mod commit;
mod outbox;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::future::BoxFuture;
use redb::{
    Database, Durability, ReadTransaction, ReadableDatabase, ReadableTable, TableDefinition,
    WriteTransaction,
};

use self::commit::Committer;
use super::record::{Cleanup, FINISHED, Found, RUNNING, Stored, UNCERTAIN};
use super::{
    AfterAttempt, Cancellation, ClaimedDelivery, DeliveryAttempt, ExecutionQuery, ExecutionRecord,
    ExecutionSummary, Fingerprint, Finish, IdempotencyKey, IdempotencyStore, OutboxEvent,
    ProcessExecutions, RecordedEvent, RecordedOutcome, Reservation, StoreError, StoredSubscription,
};

/// (caller, request_id) → the encoded record.
const RECORDS: TableDefinition<'_, (&str, &str), &[u8]> = TableDefinition::new("carmy_records");

/// How often expired records are deleted.
const CLEANUP_EVERY: Duration = Duration::from_secs(60);

/// Idempotency records in a redb file: for a single node that must remember finished calls,
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
    StoreError(Box::new(error.into()))
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
            committer: Committer::start(Arc::clone(&database))
                .map_err(|error| StoreError(Box::new(error)))?,
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
                .map_err(|error| StoreError(Box::new(error)))?;
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
        .map_err(|error| StoreError(Box::new(error)))?
}

fn purge(database: &Database) -> Result<usize, StoreError> {
    let now = now_ms();
    let transaction = database.begin_write().map_err(failed)?;
    let mut purged = 0;
    {
        let mut table = transaction.open_table(RECORDS).map_err(failed)?;
        table
            .retain(|_, bytes| {
                let keep = Record::decode(bytes).is_none_or(|record| record.expires_at > now);
                purged += usize::from(!keep);
                keep
            })
            .map_err(failed)?;
    }
    transaction.commit().map_err(failed)?;
    Ok(purged)
}

/// A record as the file keeps it.
struct Record {
    tool: String,
    digest: Vec<u8>,
    execution_id: String,
    state: String,
    reserved_at: u64,
    lease_until: u64,
    expires_at: u64,
    response: Option<Stored>,
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

impl Record {
    /// The layout is [`Record::decode`]'s.
    fn encode(&self) -> Vec<u8> {
        let mut out = Encoder::new();
        for number in [self.reserved_at, self.lease_until, self.expires_at] {
            out.number(number);
        }
        out.field(Some(self.tool.as_bytes()));
        out.field(Some(&self.digest));
        out.field(Some(self.execution_id.as_bytes()));
        out.field(Some(self.state.as_bytes()));
        let response = self.response.as_ref();
        out.field(response.map(|stored| stored.status.as_bytes()));
        out.field(response.and_then(|stored| stored.category.as_deref().map(str::as_bytes)));
        out.field(response.and_then(|stored| stored.code.as_deref().map(str::as_bytes)));
        out.field(response.map(|stored| stored.body.as_slice()));
        out.0
    }

    /// `None` for bytes this version did not write.
    fn decode(bytes: &[u8]) -> Option<Self> {
        let mut input = Decoder::new(bytes)?;
        let (reserved_at, lease_until, expires_at) =
            (input.number()?, input.number()?, input.number()?);
        let tool = input.text()??;
        let digest = input.field()??.to_vec();
        let execution_id = input.text()??;
        let state = input.text()??;
        let (status, category, code) = (input.text()?, input.text()?, input.text()?);
        let response = match (status, input.field()?) {
            (Some(status), Some(body)) => Some(Stored {
                status,
                category,
                code,
                body: body.to_vec(),
            }),
            _ => None,
        };
        Some(Record {
            tool,
            digest,
            execution_id,
            state,
            reserved_at,
            lease_until,
            expires_at,
            response,
        })
    }
}

type Table<'t> = redb::Table<'t, (&'static str, &'static str), &'static [u8]>;

fn read(table: &Table<'_>, index: (&str, &str)) -> Result<Option<Record>, StoreError> {
    let Some(bytes) = table.get(index).map_err(failed)? else {
        return Ok(None);
    };
    Record::decode(bytes.value())
        .map(Some)
        .ok_or_else(|| StoreError::message("unreadable idempotency record in the store file"))
}

impl IdempotencyStore for FileStore {
    fn reserve<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        fingerprint: &'a Fingerprint,
        execution_id: &'a Arc<str>,
        lease: Duration,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Reservation, StoreError>> {
        let (key, written, execution_id) =
            (key.clone(), fingerprint.clone(), execution_id.to_string());
        // The write returns what it found; the answer is made here, in the runtime (a running
        // record's answer holds a timer).
        let found = self.write(move |table| {
            let now = now_ms();
            let index = (key.caller(), key.request_id());
            let existing = read(table, index)?;
            if let Some(mut record) = existing.filter(|record| record.expires_at > now) {
                if record.state == RUNNING && record.lease_until < now {
                    record.state = UNCERTAIN.to_owned();
                    table
                        .insert(index, record.encode().as_slice())
                        .map_err(failed)?;
                }
                return Ok(Some(Found {
                    running_for: Duration::from_millis(now.saturating_sub(record.reserved_at)),
                    tool: record.tool,
                    digest: record.digest,
                    execution_id: record.execution_id,
                    state: record.state,
                    response: record.response,
                }));
            }
            let lease_until = now.saturating_add(millis(lease));
            let record = Record {
                tool: written.tool.to_string(),
                digest: written.digest.to_vec(),
                execution_id: execution_id.clone(),
                state: RUNNING.to_owned(),
                reserved_at: now,
                lease_until,
                // A running record lives until its lease, whatever the ttl; then uncertain.
                expires_at: lease_until.saturating_add(millis(ttl)),
                response: None,
            };
            table
                .insert(index, record.encode().as_slice())
                .map_err(failed)?;
            Ok(None)
        });
        Box::pin(async move {
            match found.await? {
                Some(found) => found.reservation(fingerprint),
                None => Ok(Reservation::Reserved),
            }
        })
    }

    fn finish<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        finish: Finish<'a>,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        // What the transaction needs, owned: reference counts, no copy of the answer.
        let (key, execution_id) = (key.clone(), Arc::clone(finish.execution_id()));
        let response = match finish {
            Finish::Response(response) => Some(response.clone()),
            Finish::Uncertain { .. } => None,
        };
        Box::pin(self.write(move |table| {
            let index = (key.caller(), key.request_id());
            let existing = read(table, index)?;
            let Some(mut record) = existing
                .filter(|record| record.execution_id == *execution_id && record.state != FINISHED)
            else {
                return Ok(());
            };
            let (state, stored) = Stored::of(match &response {
                Some(response) => Finish::Response(response),
                None => Finish::Uncertain {
                    execution_id: &execution_id,
                },
            });
            record.state = state.to_owned();
            record.response = stored;
            record.expires_at = now_ms().saturating_add(millis(ttl));
            table
                .insert(index, record.encode().as_slice())
                .map_err(failed)?;
            Ok(())
        }))
    }

    fn release<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        execution_id: &'a str,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let (key, execution_id) = (key.clone(), execution_id.to_owned());
        Box::pin(self.write(move |table| {
            let index = (key.caller(), key.request_id());
            if read(table, index)?.is_some_and(|record| record.execution_id == execution_id) {
                table.remove(index).map_err(failed)?;
            }
            Ok(())
        }))
    }

    fn purge_expired(&self) -> BoxFuture<'_, Result<usize, StoreError>> {
        let database = Arc::clone(&self.database);
        let executions = self.executions.purge_expired();
        Box::pin(async move { Ok(blocking(move || purge(&database)).await? + executions) })
    }

    fn keeps_executions(&self) -> bool {
        true
    }

    fn begin_execution<'a>(
        &'a self,
        caller: &'a str,
        execution_id: &'a Arc<str>,
        tool: &'a str,
        lease: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.executions.begin(caller, execution_id, tool, lease)
    }

    fn record_progress<'a>(
        &'a self,
        execution_id: &'a str,
        event: RecordedEvent,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.executions.progress(execution_id, event)
    }

    fn end_execution<'a>(
        &'a self,
        execution_id: &'a str,
        outcome: RecordedOutcome,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.executions.end(execution_id, outcome, ttl)
    }

    fn execution<'a>(
        &'a self,
        caller: &'a str,
        execution_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<ExecutionRecord>, StoreError>> {
        self.executions.get(caller, execution_id)
    }

    fn executions<'a>(
        &'a self,
        caller: &'a str,
        query: &'a ExecutionQuery,
    ) -> BoxFuture<'a, Result<Vec<ExecutionSummary>, StoreError>> {
        self.executions.list(caller, query)
    }

    fn cancel_execution<'a>(
        &'a self,
        caller: &'a str,
        execution_id: &'a str,
    ) -> BoxFuture<'a, Result<Cancellation, StoreError>> {
        self.executions.cancel(caller, execution_id)
    }

    fn execution_changed(&self, execution_id: &str) -> BoxFuture<'static, ()> {
        self.executions.changed(execution_id)
    }

    fn keeps_events(&self) -> bool {
        true
    }

    fn save_subscription<'a>(
        &'a self,
        subscription: &'a StoredSubscription,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let subscription = subscription.clone();
        Box::pin(
            self.transact(move |transaction| outbox::save_subscription(transaction, &subscription)),
        )
    }

    fn subscription<'a>(
        &'a self,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<StoredSubscription>, StoreError>> {
        let id = id.to_owned();
        Box::pin(self.view(move |transaction| outbox::subscription(transaction, &id)))
    }

    fn subscriptions(&self) -> BoxFuture<'_, Result<Vec<StoredSubscription>, StoreError>> {
        Box::pin(self.view(outbox::subscriptions))
    }

    fn delete_subscription<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        let id = id.to_owned();
        Box::pin(self.transact(move |transaction| outbox::delete_subscription(transaction, &id)))
    }

    fn enqueue_event<'a>(
        &'a self,
        event: &'a OutboxEvent,
        subscription_ids: &'a [Arc<str>],
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let (event, subscription_ids) = (event.clone(), subscription_ids.to_vec());
        Box::pin(self.transact(move |transaction| {
            outbox::enqueue_event(transaction, &event, &subscription_ids, now_ms())
        }))
    }

    fn claim_deliveries(
        &self,
        limit: usize,
        lease: Duration,
    ) -> BoxFuture<'_, Result<Vec<ClaimedDelivery>, StoreError>> {
        Box::pin(async move {
            // Replicas poll while the outbox is idle: look before taking the write lock, so an
            // idle outbox never writes the file.
            if !self
                .view(|transaction| outbox::any_due(transaction, now_ms()))
                .await?
            {
                return Ok(Vec::new());
            }
            // Claims need not survive a crash: only this process could honour them, and a claim
            // lost with it leaves the delivery due at once on restart. Not syncing them keeps
            // a short lease from passing while its claim is written.
            self.transact_as(Durability::None, move |transaction| {
                outbox::claim_deliveries(transaction, limit, lease, SystemTime::now())
            })
            .await
        })
    }

    fn finish_attempt<'a>(
        &'a self,
        claimed: &'a ClaimedDelivery,
        attempt: &'a DeliveryAttempt,
        after: AfterAttempt,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let (claimed, attempt) = (claimed.clone(), attempt.clone());
        Box::pin(self.transact(move |transaction| {
            outbox::finish_attempt(transaction, &claimed, &attempt, after, now_ms())
        }))
    }

    fn delivery_attempts<'a>(
        &'a self,
        subscription_id: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<DeliveryAttempt>, StoreError>> {
        let subscription_id = subscription_id.to_owned();
        Box::pin(self.view(move |transaction| {
            outbox::delivery_attempts(transaction, &subscription_id, limit)
        }))
    }

    fn pending_deliveries(&self) -> BoxFuture<'_, Result<usize, StoreError>> {
        Box::pin(self.view(outbox::pending_deliveries))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finished() -> Record {
        Record {
            tool: "create_order".to_owned(),
            digest: vec![7; 32],
            execution_id: "exec_1".to_owned(),
            state: FINISHED.to_owned(),
            reserved_at: 1,
            lease_until: 2,
            expires_at: 3,
            response: Some(Stored {
                status: "failed".to_owned(),
                category: Some("conflict".to_owned()),
                code: None,
                body: b"{\"a\":1}".to_vec(),
            }),
        }
    }

    #[test]
    fn records_round_trip_and_damaged_bytes_are_refused_not_misread() {
        let bytes = finished().encode();
        let decoded = Record::decode(&bytes).expect("decodes");
        assert_eq!(decoded.encode(), bytes);
        assert_eq!(decoded.response, finished().response);
        for length in 0..bytes.len() {
            assert!(Record::decode(&bytes[..length]).is_none(), "{length} bytes");
        }
        let mut other_version = bytes.clone();
        other_version[0] = FORMAT + 1;
        assert!(Record::decode(&other_version).is_none());
    }
}
