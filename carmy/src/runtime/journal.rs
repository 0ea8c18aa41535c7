//! A kept execution's events, written to the store as they come so any replica replays them,
//! and the cancellation another replica asks for through the store.

use super::*;

/// The SSE id of `execution.started`; progress events follow it.
pub(crate) const STARTED_EVENT_ID: u64 = 1;

pub(super) const FIRST_PROGRESS_ID: u64 = STARTED_EVENT_ID + 1;

/// A kept execution's progress, numbered as the stream numbers it, written to the store and
/// passed on to the client streaming the call.
pub(super) struct Journal {
    pub(super) store: Arc<dyn ExecutionStore>,
    pub(super) execution_id: Arc<str>,
    pub(super) events: EventReceiver,
    pub(super) forward: Option<EventSender>,
    /// The id after the last event written: `execution.completed`'s once the tool has ended.
    pub(super) next_id: u64,
}

impl Journal {
    pub(super) async fn write_forever(&mut self) {
        loop {
            let event = self.events.recv().await;
            self.write(event).await;
        }
    }

    /// Writes what the tool reported before it ended.
    pub(super) async fn write_waiting(&mut self) {
        while let Some(event) = self.events.try_recv() {
            self.write(event).await;
        }
    }

    async fn write(&mut self, event: Event) {
        let Event::Progress(progress) = &event else {
            return;
        };
        let data = response::progress_data(&self.execution_id, progress);
        let recorded = RecordedEvent {
            id: FIRST_PROGRESS_ID + progress.sequence,
            data,
        };
        self.next_id = recorded.id + 1;
        if let Err(error) = self
            .store
            .record_progress(&self.execution_id, recorded)
            .await
        {
            tracing::warn!(%error, "could not record a progress event");
        }
        if let Some(forward) = &self.forward {
            forward.send(event);
        }
    }
}

/// Resolves when someone asks, through the store, for the execution to be cancelled.
pub(super) async fn cancellation_requested(
    store: Arc<dyn ExecutionStore>,
    caller: Arc<str>,
    execution_id: Arc<str>,
) {
    loop {
        let changed = store.execution_changed(&execution_id);
        if let Ok(Some(record)) = store.execution(&caller, &execution_id).await
            && record.cancel_requested
        {
            return;
        }
        changed.await;
    }
}
