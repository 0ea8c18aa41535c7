//! The Redis engine's executions: a hash each with its events in a list (one hash tag), and
//! an index per caller; every change announced (`PUBLISH`) by the script that makes it.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;

use super::{Inner, RedisStore, failed, millis};
use crate::store::record::{Stored, within};
use crate::store::{
    Cancellation, ExecutionQuery, ExecutionRecord, ExecutionState, ExecutionStore,
    ExecutionSummary, Finish, KEPT_PROGRESS, RecordedEvent, RecordedOutcome, StoreError,
};

/// An execution's hash; its events' list shares the hash tag (one cluster slot).
fn execution_key(execution_id: &str) -> String {
    format!("carmy:execution:{{{execution_id}}}")
}

fn events_key(execution_id: &str) -> String {
    format!("carmy:execution:{{{execution_id}}}:events")
}

/// A caller's executions, by id (a UUID v7: lexical order is time order).
fn caller_key(caller: &str) -> String {
    format!("carmy:executions:{{{}:{caller}}}", caller.len())
}

fn unreadable(what: &str) -> StoreError {
    StoreError::message(format!("unreadable execution: {what}"))
}

fn text(bytes: Vec<u8>) -> Result<String, StoreError> {
    String::from_utf8(bytes).map_err(|_| unreadable("not UTF-8"))
}

impl Inner {
    async fn read_execution(
        &self,
        caller: &str,
        execution_id: &str,
    ) -> Result<Option<ExecutionRecord>, StoreError> {
        let reply: Vec<redis::Value> = self
            .read_execution
            .key(execution_key(execution_id))
            .key(events_key(execution_id))
            .arg(caller)
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(failed)?;
        if reply.is_empty() {
            return Ok(None);
        }
        let mut fields = reply.into_iter();
        let mut next_bytes = || -> Result<Vec<u8>, StoreError> {
            match fields.next() {
                Some(value) => redis::from_redis_value(value).map_err(StoreError::new),
                None => Err(unreadable("missing field")),
            }
        };
        let tool = text(next_bytes()?)?;
        let status = text(next_bytes()?)?;
        let category = text(next_bytes()?)?;
        let code = text(next_bytes()?)?;
        let body = next_bytes()?;
        let final_event_id = text(next_bytes()?)?;
        let cancel = text(next_bytes()?)?;
        let events: Vec<Vec<u8>> = match fields.next() {
            Some(value) => redis::from_redis_value(value).map_err(StoreError::new)?,
            None => Vec::new(),
        };
        let progress = events
            .into_iter()
            .map(|entry| {
                let space = entry
                    .iter()
                    .position(|byte| *byte == b' ')
                    .ok_or_else(|| unreadable("event"))?;
                let id = std::str::from_utf8(&entry[..space])
                    .ok()
                    .and_then(|id| id.parse().ok())
                    .ok_or_else(|| unreadable("event id"))?;
                Ok(RecordedEvent {
                    id,
                    data: entry[space + 1..].to_vec().into(),
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        let outcome = if status.is_empty() {
            None
        } else {
            let stored = Stored {
                status,
                category: (!category.is_empty()).then_some(category),
                code: (!code.is_empty()).then_some(code),
                body,
            };
            Some(RecordedOutcome {
                response: stored.response(execution_id)?,
                event_id: final_event_id
                    .parse()
                    .map_err(|_| unreadable("final event id"))?,
            })
        };
        Ok(Some(ExecutionRecord {
            execution_id: Arc::from(execution_id),
            tool: Arc::from(tool),
            progress,
            outcome,
            cancel_requested: cancel == "1",
        }))
    }

    async fn list_executions(
        &self,
        caller: &str,
        query: &ExecutionQuery,
    ) -> Result<Vec<ExecutionSummary>, StoreError> {
        let index = caller_key(caller);
        let mut connection = self.connection.clone();
        let mut found = Vec::new();
        let mut upper = match &query.before {
            Some(before) => format!("({before}"),
            None => "+".to_owned(),
        };
        // Pages of the index until enough executions match (expired ones leave the index here).
        while found.len() < query.limit {
            let ids: Vec<String> = redis::cmd("ZREVRANGEBYLEX")
                .arg(&index)
                .arg(&upper)
                .arg("-")
                .arg("LIMIT")
                .arg(0)
                .arg(query.limit)
                .query_async(&mut connection)
                .await
                .map_err(failed)?;
            let Some(last) = ids.last() else { break };
            upper = format!("({last}");
            for id in &ids {
                let mut read = redis::cmd("HMGET");
                read.arg(execution_key(id)).arg("tool").arg("status");
                let (tool, status): (Option<String>, Option<String>) =
                    read.query_async(&mut connection).await.map_err(failed)?;
                let Some(tool) = tool else {
                    let _: i64 = redis::cmd("ZREM")
                        .arg(&index)
                        .arg(id)
                        .query_async(&mut connection)
                        .await
                        .map_err(failed)?;
                    continue;
                };
                let state = match status {
                    None => ExecutionState::Running,
                    Some(status) => {
                        ExecutionState::from_wire(&status).ok_or_else(|| unreadable("status"))?
                    }
                };
                let wanted = query.state.is_none_or(|wanted| wanted == state)
                    && query.tool.as_deref().is_none_or(|wanted| wanted == tool);
                if wanted && found.len() < query.limit {
                    found.push(ExecutionSummary {
                        execution_id: Arc::from(id.as_str()),
                        tool: Arc::from(tool),
                        state,
                    });
                }
            }
        }
        Ok(found)
    }
}

impl ExecutionStore for RedisStore {
    fn begin_execution<'a>(
        &'a self,
        caller: &'a str,
        execution_id: &'a Arc<str>,
        tool: &'a str,
        lease: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(within(self.timeout, async move {
            let mut connection = self.inner.connection.clone();
            let _: i64 = self
                .inner
                .begin_execution
                .key(execution_key(execution_id))
                .arg(caller)
                .arg(tool)
                .arg(millis(lease))
                .invoke_async(&mut connection)
                .await
                .map_err(failed)?;
            // The caller's index lives in the caller's slot: a second command. Its entries
            // outlive their executions and are dropped when a listing finds them gone.
            let index = caller_key(caller);
            let _: () = redis::pipe()
                .cmd("ZADD")
                .arg(&index)
                .arg(0)
                .arg(&**execution_id)
                .ignore()
                .cmd("PERSIST")
                .arg(&index)
                .ignore()
                .query_async(&mut connection)
                .await
                .map_err(failed)?;
            Ok(())
        }))
    }

    fn record_progress<'a>(
        &'a self,
        execution_id: &'a str,
        event: RecordedEvent,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(within(self.timeout, async move {
            let _: i64 = self
                .inner
                .record_progress
                .key(execution_key(execution_id))
                .key(events_key(execution_id))
                .arg(event.id)
                .arg(event.data.as_ref())
                .arg(KEPT_PROGRESS)
                .arg(execution_id)
                .invoke_async(&mut self.inner.connection.clone())
                .await
                .map_err(failed)?;
            Ok(())
        }))
    }

    fn end_execution<'a>(
        &'a self,
        execution_id: &'a str,
        outcome: RecordedOutcome,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(within(self.timeout, async move {
            let (_, stored) = Stored::of(Finish::Response(&outcome.response));
            let stored = stored.ok_or_else(|| unreadable("an ended execution has a response"))?;
            let _: i64 = self
                .inner
                .end_execution
                .key(execution_key(execution_id))
                .key(events_key(execution_id))
                .arg(&stored.status)
                .arg(stored.category.as_deref().unwrap_or(""))
                .arg(stored.code.as_deref().unwrap_or(""))
                .arg(stored.body.as_slice())
                .arg(outcome.event_id)
                .arg(millis(ttl))
                .arg(execution_id)
                .invoke_async(&mut self.inner.connection.clone())
                .await
                .map_err(failed)?;
            Ok(())
        }))
    }

    fn execution<'a>(
        &'a self,
        caller: &'a str,
        execution_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<ExecutionRecord>, StoreError>> {
        Box::pin(within(
            self.timeout,
            self.inner.read_execution(caller, execution_id),
        ))
    }

    fn executions<'a>(
        &'a self,
        caller: &'a str,
        query: &'a ExecutionQuery,
    ) -> BoxFuture<'a, Result<Vec<ExecutionSummary>, StoreError>> {
        Box::pin(within(
            self.timeout,
            self.inner.list_executions(caller, query),
        ))
    }

    fn cancel_execution<'a>(
        &'a self,
        caller: &'a str,
        execution_id: &'a str,
    ) -> BoxFuture<'a, Result<Cancellation, StoreError>> {
        Box::pin(within(self.timeout, async move {
            let found: String = self
                .inner
                .cancel_execution
                .key(execution_key(execution_id))
                .arg(caller)
                .arg(execution_id)
                .invoke_async(&mut self.inner.connection.clone())
                .await
                .map_err(failed)?;
            Ok(match found.as_str() {
                "requested" => Cancellation::Requested,
                "ended" => Cancellation::Ended,
                _ => Cancellation::NotFound,
            })
        }))
    }

    fn execution_changed(&self, execution_id: &str) -> BoxFuture<'static, ()> {
        self.announcements.changed(execution_id)
    }

    fn ping(&self) -> Option<BoxFuture<'_, Result<(), StoreError>>> {
        Some(self.answers())
    }
}
