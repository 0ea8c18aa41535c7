//! Records in an embedded database file (redb): one node, kept across restarts.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::future::BoxFuture;
use redb::{Database, ReadableTable, TableDefinition};

use super::record::{Cleanup, FINISHED, Found, RUNNING, Stored, UNCERTAIN};
use super::{
    Cancellation, ExecutionQuery, ExecutionRecord, ExecutionSummary, Fingerprint, Finish,
    IdempotencyKey, IdempotencyStore, ProcessExecutions, RecordedEvent, RecordedOutcome,
    Reservation, StoreError,
};

/// (caller, request_id) → the encoded record.
const RECORDS: TableDefinition<'_, (&str, &str), &[u8]> = TableDefinition::new("carmy_records");

/// How often expired records are deleted.
const CLEANUP_EVERY: Duration = Duration::from_secs(60);

/// Idempotency records in a redb file: for a single node that must remember finished calls,
/// and calls interrupted by a crash, across restarts, without running a database server.
/// Every transition is a durable write transaction; only one process may open the file.
///
/// Executions (`protocol.md` §9) are kept in this process's memory, bounded to 64 MiB like the
/// in-memory store's: the one process that owns the file answers for them, but they do not
/// survive a restart (the idempotency records do).
pub struct FileStore {
    database: Arc<Database>,
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
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, millis)
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
            database,
            _cleanup: cleanup,
        })
    }

    /// Runs `work` in a write transaction on a blocking thread; commits when it returns `Ok`.
    async fn write<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Table<'_>) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let database = Arc::clone(&self.database);
        blocking(move || {
            let transaction = database.begin_write().map_err(failed)?;
            let result = {
                let mut table = transaction.open_table(RECORDS).map_err(failed)?;
                work(&mut table)?
            };
            transaction.commit().map_err(failed)?;
            Ok(result)
        })
        .await
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

/// The encoding's version, first byte of every record.
const FORMAT: u8 = 1;

impl Record {
    /// Length-prefixed fields; the layout is [`Record::decode`]'s.
    fn encode(&self) -> Vec<u8> {
        let mut out = vec![FORMAT];
        for number in [self.reserved_at, self.lease_until, self.expires_at] {
            out.extend_from_slice(&number.to_le_bytes());
        }
        let mut field = |bytes: Option<&[u8]>| match bytes {
            Some(bytes) => {
                out.push(1);
                out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
                out.extend_from_slice(bytes);
            }
            None => out.push(0),
        };
        field(Some(self.tool.as_bytes()));
        field(Some(&self.digest));
        field(Some(self.execution_id.as_bytes()));
        field(Some(self.state.as_bytes()));
        let response = self.response.as_ref();
        field(response.map(|stored| stored.status.as_bytes()));
        field(response.and_then(|stored| stored.category.as_deref().map(str::as_bytes)));
        field(response.and_then(|stored| stored.code.as_deref().map(str::as_bytes)));
        field(response.map(|stored| stored.body.as_slice()));
        out
    }

    /// `None` for bytes this version did not write.
    fn decode(bytes: &[u8]) -> Option<Self> {
        let (&format, mut rest) = bytes.split_first()?;
        if format != FORMAT {
            return None;
        }
        let mut number = || -> Option<u64> {
            let (head, tail) = rest.split_at_checked(8)?;
            rest = tail;
            Some(u64::from_le_bytes(head.try_into().ok()?))
        };
        let (reserved_at, lease_until, expires_at) = (number()?, number()?, number()?);
        let mut field = || -> Option<Option<Vec<u8>>> {
            let (&present, tail) = rest.split_first()?;
            rest = tail;
            if present == 0 {
                return Some(None);
            }
            let (length, tail) = rest.split_at_checked(8)?;
            let length = usize::try_from(u64::from_le_bytes(length.try_into().ok()?)).ok()?;
            let (value, tail) = tail.split_at_checked(length)?;
            rest = tail;
            Some(Some(value.to_vec()))
        };
        let text = |bytes: Vec<u8>| String::from_utf8(bytes).ok();
        let tool = text(field()??)?;
        let digest = field()??;
        let execution_id = text(field()??)?;
        let state = text(field()??)?;
        let (status, category, code, body) = (field()?, field()?, field()?, field()?);
        let response = match (status, body) {
            (Some(status), Some(body)) => Some(Stored {
                status: text(status)?,
                category: match category {
                    Some(category) => Some(text(category)?),
                    None => None,
                },
                code: match code {
                    Some(code) => Some(text(code)?),
                    None => None,
                },
                body,
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
        let (key, fingerprint, execution_id) =
            (key.clone(), fingerprint.clone(), execution_id.to_string());
        Box::pin(self.write(move |table| {
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
                let found = Found {
                    running_for: Duration::from_millis(now.saturating_sub(record.reserved_at)),
                    tool: record.tool,
                    digest: record.digest,
                    execution_id: record.execution_id,
                    state: record.state,
                    response: record.response,
                };
                return found.reservation(&fingerprint);
            }
            let lease_until = now.saturating_add(millis(lease));
            let record = Record {
                tool: fingerprint.tool.to_string(),
                digest: fingerprint.digest.to_vec(),
                execution_id,
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
            Ok(Reservation::Reserved)
        }))
    }

    fn finish<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        finish: Finish,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let key = key.clone();
        Box::pin(self.write(move |table| {
            let index = (key.caller(), key.request_id());
            let existing = read(table, index)?;
            let Some(mut record) = existing.filter(|record| {
                record.execution_id == **finish.execution_id() && record.state != FINISHED
            }) else {
                return Ok(());
            };
            let (state, stored) = Stored::of(&finish);
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
