//! The file engine's idempotency records: one table, (caller, request id) → the encoded record.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use redb::{Database, ReadableTable, TableDefinition};

use super::{Decoder, Encoder, FileStore, blocking, failed, millis, now_ms};
use crate::store::record::{FINISHED, Found, RUNNING, Stored, UNCERTAIN};
use crate::store::{Fingerprint, Finish, IdempotencyKey, KeyStore, Reservation, StoreError};

/// (caller, request_id) → the encoded record.
pub(super) const RECORDS: TableDefinition<'_, (&str, &str), &[u8]> =
    TableDefinition::new("carmy_records");

pub(super) fn purge(database: &Database) -> Result<usize, StoreError> {
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

pub(super) type Table<'t> = redb::Table<'t, (&'static str, &'static str), &'static [u8]>;

fn read(table: &Table<'_>, index: (&str, &str)) -> Result<Option<Record>, StoreError> {
    let Some(bytes) = table.get(index).map_err(failed)? else {
        return Ok(None);
    };
    Record::decode(bytes.value())
        .map(Some)
        .ok_or_else(|| StoreError::message("unreadable idempotency record in the store file"))
}

impl KeyStore for FileStore {
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
}

#[cfg(test)]
mod tests {
    use super::super::FORMAT;
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
