//! What a tool knows about the call it serves.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::health::Health;
pub(crate) use crate::principal::{Principal, TrustLevel};

/// Who is on the other end of a call: a person (a browser, the console) or an agent (an SDK,
/// curl, an MCP client). Tools may word their answers for it; it grants nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Requester {
    /// A person: the request prefers `text/html`, or says `Carmy-Channel: human`.
    Human,
    /// Everything else (`protocol.md` §10).
    #[default]
    Agent,
}

/// A progress report from a tool, streamed to clients that asked for events.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Progress {
    /// Work done so far.
    pub(crate) progress: u64,
    /// Total work, when known.
    pub(crate) total: Option<u64>,
    /// What the tool is doing.
    pub(crate) message: Option<String>,
    /// How many reports came before this one (set by the channel): an execution's kept events
    /// are numbered by it, so a report dropped on the way leaves a gap, not a shift.
    pub(crate) sequence: u64,
}

/// What an execution tells a transport that streams.
#[derive(Debug)]
pub(crate) enum Event {
    /// The answer will carry this execution id.
    Started {
        execution_id: Arc<str>,
        tool: String,
    },
    /// The tool reported progress.
    Progress(Progress),
}

/// How many events wait for a reader that is behind (a client that stopped reading). Past it,
/// progress is coalesced: a report replaces the newest waiting one, since progress is a level
/// and only the latest matters. The answer itself never waits here, so it is never lost.
const EVENT_BUFFER: usize = 64;

/// A bounded queue of one execution's events: the tool never waits for its reader, and a reader
/// that stops reading costs at most [`EVENT_BUFFER`] events.
pub(crate) fn event_channel() -> (EventSender, EventReceiver) {
    channel(EVENT_BUFFER, Overflow::CoalesceNewest)
}

/// The queue of a kept execution's events on their way to the store, which keeps the latest
/// `capacity` progress reports: past it the oldest waiting report is dropped.
pub(crate) fn journal_channel(capacity: usize) -> (EventSender, EventReceiver) {
    channel(capacity, Overflow::DropOldest)
}

/// What a full queue does with one more progress report.
#[derive(Clone, Copy)]
enum Overflow {
    /// It replaces the newest waiting one (a level: only the latest matters to a live reader).
    CoalesceNewest,
    /// The oldest waiting one is dropped (a log of the latest reports).
    DropOldest,
}

fn channel(capacity: usize, overflow: Overflow) -> (EventSender, EventReceiver) {
    let shared = Arc::new(EventQueue {
        events: Mutex::new(Queue::default()),
        ready: Notify::new(),
        reader_gone: AtomicBool::new(false),
        capacity,
        overflow,
    });
    (
        EventSender {
            shared: Arc::clone(&shared),
        },
        EventReceiver { shared },
    )
}

struct EventQueue {
    events: Mutex<Queue>,
    ready: Notify,
    /// Set when the receiver is dropped: events are discarded from then on.
    reader_gone: AtomicBool,
    capacity: usize,
    overflow: Overflow,
}

#[derive(Default)]
struct Queue {
    waiting: VecDeque<Event>,
    /// Progress reports sent so far.
    reports: u64,
}

impl EventQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        // Only pushes and pops happen under the lock: a poisoned queue is still consistent.
        self.events.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The execution's end of an [`event_channel`].
#[derive(Clone)]
pub(crate) struct EventSender {
    shared: Arc<EventQueue>,
}

impl fmt::Debug for EventSender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventSender").finish_non_exhaustive()
    }
}

impl EventSender {
    /// Queues `event` without waiting; once the queue is full, progress is coalesced or the
    /// oldest dropped, as the channel was made to.
    pub(crate) fn send(&self, mut event: Event) {
        if self.shared.reader_gone.load(Ordering::Acquire) {
            return;
        }
        let mut queue = self.shared.lock();
        if let Event::Progress(progress) = &mut event {
            progress.sequence = queue.reports;
            queue.reports += 1;
        }
        match (event, self.shared.overflow) {
            (Event::Progress(progress), Overflow::CoalesceNewest)
                if queue.waiting.len() >= self.shared.capacity =>
            {
                match queue.waiting.back_mut() {
                    Some(Event::Progress(newest)) => *newest = progress,
                    _ => queue.waiting.push_back(Event::Progress(progress)),
                }
            }
            (event, Overflow::DropOldest) if queue.waiting.len() >= self.shared.capacity => {
                let oldest = queue
                    .waiting
                    .iter()
                    .position(|waiting| matches!(waiting, Event::Progress(_)));
                if let Some(oldest) = oldest {
                    queue.waiting.remove(oldest);
                }
                queue.waiting.push_back(event);
            }
            (event, _) => queue.waiting.push_back(event),
        }
        drop(queue);
        self.shared.ready.notify_one();
    }
}

/// The transport's end of an [`event_channel`].
pub(crate) struct EventReceiver {
    shared: Arc<EventQueue>,
}

impl EventReceiver {
    /// The next event, waiting for one.
    pub(crate) async fn recv(&mut self) -> Event {
        loop {
            if let Some(event) = self.try_recv() {
                return event;
            }
            // `notify_one` keeps a permit when nobody waits: no event slips between the check
            // and the wait.
            self.shared.ready.notified().await;
        }
    }

    /// The next event, if one is waiting.
    pub(crate) fn try_recv(&mut self) -> Option<Event> {
        self.shared.lock().waiting.pop_front()
    }
}

impl Drop for EventReceiver {
    fn drop(&mut self) {
        self.shared.reader_gone.store(true, Ordering::Release);
        self.shared.lock().waiting.clear();
    }
}

/// What a tool knows about the call it serves: ids, the caller, cancellation, and a way to
/// report progress. Take it as a parameter: `ctx: carmy::Context`.
///
/// ```standalone_crate
/// use carmy::{Context, JsonSchema, ToolError};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Deserialize, JsonSchema)]
/// struct Export {
///     /// How many pages to export.
///     pages: u32,
/// }
///
/// #[derive(Serialize, JsonSchema)]
/// struct Exported {
///     pages: u32,
///     by: String,
/// }
///
/// /// Export the catalog, page by page.
/// #[carmy::tool(effect = "read", idempotent = true)]
/// async fn export(ctx: Context, input: Export) -> Result<Exported, ToolError> {
///     for page in 1..=input.pages {
///         if ctx.is_cancelled() {
///             return Err(ToolError::cancelled("STOPPED", "the export was stopped"));
///         }
///         // A streaming client (SSE, MCP with a progress token) sees each step.
///         ctx.progress(u64::from(page), Some(u64::from(input.pages)), None);
///     }
///     Ok(Exported { pages: input.pages, by: ctx.principal().id().to_owned() })
/// }
/// ```
#[derive(Clone)]
pub struct Context {
    inner: Arc<ContextInner>,
}

struct ContextInner {
    execution_id: Arc<str>,
    request_id: Option<Arc<str>>,
    principal: Principal,
    requester: Requester,
    /// Made when first asked for: most tools never look at it.
    cancellation: OnceLock<CancellationToken>,
    events: Option<EventSender>,
    health: Health,
}

impl Context {
    pub(crate) fn new(
        execution_id: Arc<str>,
        request_id: Option<Arc<str>>,
        principal: Principal,
        requester: Requester,
        events: Option<EventSender>,
        health: Health,
    ) -> Self {
        Context {
            inner: Arc::new(ContextInner {
                execution_id,
                request_id,
                principal,
                requester,
                cancellation: OnceLock::new(),
                events,
                health,
            }),
        }
    }

    /// Fires the cancellation when dropped, however the execution ends.
    pub(crate) fn cancel_on_exit(&self) -> CancelOnExit {
        CancelOnExit(self.clone())
    }

    /// This execution's id (`exec_…`).
    pub fn execution_id(&self) -> &str {
        &self.inner.execution_id
    }

    /// The client's `request_id`, when it sent one.
    pub fn request_id(&self) -> Option<&str> {
        self.inner.request_id.as_deref()
    }

    /// Who is calling.
    pub fn principal(&self) -> &Principal {
        &self.inner.principal
    }

    /// Whether a person or an agent made the call (`Carmy-Channel`, or a browser's `Accept`).
    pub fn requester(&self) -> Requester {
        self.inner.requester
    }

    /// Fires when the execution is cancelled (client gone, deadline passed, shutdown). The tool's
    /// future is dropped right after; use the token to stop work handed to other tasks.
    pub fn cancellation_token(&self) -> &CancellationToken {
        self.inner.cancellation.get_or_init(CancellationToken::new)
    }

    /// The service's health: a tool that finds a dependency broken reports it
    /// (`ctx.health().report_degrading("…")`).
    pub fn health(&self) -> &Health {
        &self.inner.health
    }

    /// Whether the execution has been cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.inner
            .cancellation
            .get()
            .is_some_and(CancellationToken::is_cancelled)
    }

    /// Reports progress to clients that stream events; a no-op for the others.
    pub fn progress(
        &self,
        done: u64,
        total: impl Into<Option<u64>>,
        message: impl Into<Option<String>>,
    ) {
        if let Some(events) = &self.inner.events {
            events.send(Event::Progress(Progress {
                progress: done,
                total: total.into(),
                message: message.into(),
                sequence: 0,
            }));
        }
    }
}

/// Cancels an execution's [`Context`] when dropped: whatever the tool handed to other tasks
/// (the context or its token) sees the cancellation.
pub(crate) struct CancelOnExit(Context);

impl Drop for CancelOnExit {
    fn drop(&mut self) {
        let inner = &self.0.inner;
        // Held here alone and its token never made: nobody can look at it any more.
        if Arc::strong_count(inner) > 1 || inner.cancellation.get().is_some() {
            self.0.cancellation_token().cancel();
        }
    }
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("execution_id", &self.inner.execution_id)
            .field("request_id", &self.inner.request_id)
            .field("principal", &self.inner.principal.id())
            .field("requester", &self.inner.requester)
            .field("cancelled", &self.is_cancelled())
            .finish_non_exhaustive()
    }
}
