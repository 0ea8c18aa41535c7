//! The MCP methods, answered by the runtime: `tools/list` from the catalog, `tools/call` through
//! the same pipeline as `POST /agent/execute`. The SDK handles the wire (both protocol
//! generations, sessions, headers, cancellation); this file only maps carmy to MCP.

use std::borrow::Cow;
use std::sync::Arc;

use axum::http::Extensions;
use axum::http::request::Parts;
use rmcp::model::{
    CacheScope, CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams,
    ContentBlock, CreateTaskResult, DetailedTask, GetTaskParams, GetTaskResult,
    InitializeRequestParams, InitializeResult, ListToolsResult, MetaObject, PaginatedRequestParams,
    ProgressNotificationParam, ProgressToken, ProtocolVersion, ServerCapabilities, ServerConfig,
    Task, TaskPayload, TaskStatus,
};
use rmcp::service::{Peer, RequestContext};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::sessions::Opening;
use crate::catalog::mcp::{self as tools, LIST_TTL_MS};
use crate::context::{Event, EventReceiver, Requester, event_channel};
use crate::executions::{self, RETRY_AFTER};
use crate::http::{Admitted, settings_of};
use crate::principal::Principal;
use crate::runtime::{self, Answer, Call, Delivery, Outcome, Runtime};
use crate::settings::{Current, Settings};
use crate::status::ExecutionStatus;
use crate::store::Cancellation;
use crate::telemetry::{self, TraceParent};
use crate::tool_error::ToolError;
use crate::wire::codes;

/// The `_meta` key of a `tools/call` that carries the idempotency key, as `request_id` does
/// over HTTP.
pub(crate) const REQUEST_ID_META_KEY: &str = "dev.carmy/request_id";
/// The `_meta` key of the caller's W3C trace context, as the MCP semantic conventions name it.
const TRACEPARENT_META_KEY: &str = "traceparent";

/// The protocol revisions served: the stateless 2026-07-28 and the `initialize` generations
/// that have structured tool output.
const SUPPORTED_VERSIONS: &[ProtocolVersion] = &[
    ProtocolVersion::V_2025_06_18,
    ProtocolVersion::V_2025_11_25,
    ProtocolVersion::V_2026_07_28,
];

/// Answers MCP requests for one app. Cloned per request (the SDK's service factory), so it is a
/// handle to shared parts.
#[derive(Clone)]
pub(crate) struct McpHandler {
    shared: Arc<Shared>,
}

struct Shared {
    runtime: Arc<Runtime>,
    /// The configuration in force, for requests that come with no HTTP request (stdio).
    current: Current,
    info: ServerConfig,
    /// The caller of requests that come with no HTTP request (stdio).
    local_principal: Principal,
}

impl std::fmt::Debug for McpHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpHandler")
            .field("server", &self.shared.info.server_info.name)
            .finish_non_exhaustive()
    }
}

impl McpHandler {
    /// The executions of this app, read back for their callers.
    fn executions(&self) -> crate::executions::Executions {
        crate::executions::Executions::new(Arc::clone(self.shared.runtime.execution_store()))
    }

    pub(crate) fn new(
        name: &str,
        runtime: Arc<Runtime>,
        current: Current,
        local_principal: Principal,
    ) -> Self {
        // Tasks (the 2026-07-28 tasks extension) are executions run detached (`protocol.md` §9).
        let capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_tasks()
            .build();
        let mut info = ServerConfig::new(capabilities);
        info.server_info = rmcp::model::Implementation::new(name, env!("CARGO_PKG_VERSION"));
        McpHandler {
            shared: Arc::new(Shared {
                runtime,
                current,
                info,
                local_principal,
            }),
        }
    }

    /// Runs `work` in a task that a graceful shutdown waits for, as it waits for executions.
    pub(super) fn spawn<F>(&self, work: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.shared.runtime.spawn(work)
    }

    /// The caller and the configuration snapshot: what the HTTP gate attached to the request,
    /// or the local principal and the configuration in force.
    fn caller(&self, context: &RequestContext<RoleServer>) -> (Principal, Arc<Settings>) {
        match context.extensions.get::<Parts>() {
            Some(parts) => self.caller_of(&parts.extensions),
            None => (
                self.shared.local_principal.clone(),
                self.shared.current.load_full(),
            ),
        }
    }

    /// The caller and the configuration snapshot the HTTP gate attached to a request.
    fn caller_of(&self, extensions: &Extensions) -> (Principal, Arc<Settings>) {
        (
            Admitted::caller_or_anonymous(extensions),
            settings_of(extensions, &self.shared.current),
        )
    }

    /// `tools/call` of a request that the SDK would hand to [`ServerHandler::call_tool`]
    /// unchanged, without a progress token or the tasks extension ([`super::direct`]): the same
    /// answer, without the SDK's context. `cancel` stands for the SDK's token; dropping the
    /// future (a stateless client went away) cancels the execution too.
    pub(super) async fn call_directly(
        &self,
        name: String,
        arguments: Map<String, Value>,
        meta: &Map<String, Value>,
        extensions: &Extensions,
        cancel: CancellationToken,
    ) -> Result<CallToolResponse, ErrorData> {
        let span = call_span(meta, &name);
        async {
            let (principal, settings) = self.caller_of(extensions);
            let (call, structured) = match prepare(name, arguments, meta, principal, &settings) {
                Ok(prepared) => prepared,
                Err(error) => return Ok(refused(&error)),
            };
            let client_gone = cancel.clone().drop_guard();
            let outcome = self.shared.runtime.execute(call, cancel, None).await;
            client_gone.disarm();
            answer(&outcome, structured)
        }
        .instrument(span)
        .await
    }
}

impl ServerHandler for McpHandler {
    fn get_info(&self) -> ServerConfig {
        self.shared.info.clone()
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(SUPPORTED_VERSIONS)
    }

    /// The SDK's `initialize`, which also tells the request opening a session over HTTP
    /// whether its client takes tasks ([`Opening`]).
    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        if let Some(opening) = context
            .extensions
            .get::<Parts>()
            .and_then(|parts| parts.extensions.get::<Opening>())
        {
            opening.record(request.capabilities.supports_tasks());
        }
        context.peer.set_peer_info(request.clone());
        self.negotiate_initialize(&request)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let (principal, settings) = self.caller(&context);
        Ok(
            ListToolsResult::with_all_items(settings.mcp_tools(principal.trust()).to_vec())
                .with_ttl_ms(LIST_TTL_MS)
                .with_cache_scope(CacheScope::Private),
        )
    }

    /// Each call is a `tools/call {tool}` span ([`call_span`]).
    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let span = call_span(&context.meta.0, &request.name);
        self.call(request, context).instrument(span).await
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        Ok(GetTaskResult::new(
            self.task(&request.task_id, &context).await?,
        ))
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let (principal, _) = self.caller(&context);
        match self.executions().cancel(&principal, &request.task_id).await {
            Ok(Cancellation::Requested | Cancellation::Ended) => Ok(()),
            Ok(Cancellation::NotFound) => Err(no_such_task()),
            Err(error) => Err(ErrorData::internal_error(error.message().to_owned(), None)),
        }
    }
}

impl McpHandler {
    /// `tools/call`, through the runtime.
    async fn call(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let (principal, settings) = self.caller(&context);
        let (call, structured) = match prepare(
            request.name.into_owned(),
            request.arguments.unwrap_or_default(),
            &context.meta.0,
            principal,
            &settings,
        ) {
            Ok(prepared) => prepared,
            Err(error) => return Ok(refused(&error)),
        };
        // The SDK fires this token on `notifications/cancelled`, on a closed response stream
        // (2026-07-28) and when the session ends.
        let cancel = context.ct.clone();
        // A client that takes tasks gets one for a call that runs detached (its tool is not
        // `mode = "sync"`, its caller identified); progress then goes to the record.
        let takes_tasks = context
            .client_capabilities()
            .is_some_and(|capabilities| capabilities.supports_tasks());
        if takes_tasks {
            let delivery = Delivery {
                cancel: Some(cancel),
                events: None,
                prefer_async: true,
            };
            return match self.shared.runtime.call(call, delivery).await {
                Answer::Accepted(accepted) => Ok(CallToolResponse::Task(CreateTaskResult::new(
                    self.task_of(&accepted.execution_id),
                ))),
                Answer::Outcome(outcome) => answer(&outcome, structured),
            };
        }
        let outcome = match context.meta.get_progress_token() {
            None => self.shared.runtime.execute(call, cancel, None).await,
            Some(token) => {
                let (events, receiver) = event_channel();
                let execution = self.shared.runtime.execute(call, cancel, Some(events));
                // Boxed: the SDK's notification futures are kilobytes, which every call's
                // future would carry and move otherwise.
                Box::pin(forward_progress(execution, receiver, &context.peer, token)).await
            }
        };
        answer(&outcome, structured)
    }
}

impl McpHandler {
    /// The task that execution `execution_id` is. It is kept at least the record ttl from its
    /// creation (the ttl runs from its end).
    fn task_of(&self, execution_id: &str) -> Task {
        let created = executions::created_at(execution_id);
        let ttl = self.shared.runtime.record_ttl().as_millis();
        Task::new(
            execution_id.to_owned(),
            TaskStatus::Working,
            created.clone(),
            created,
        )
        .with_poll_interval_ms(poll_interval_ms())
        .with_ttl_ms(u64::try_from(ttl).unwrap_or(u64::MAX))
    }

    /// `tasks/get`: the caller's execution as a task; another caller's is unknown.
    async fn task(
        &self,
        task_id: &str,
        context: &RequestContext<RoleServer>,
    ) -> Result<DetailedTask, ErrorData> {
        let (principal, settings) = self.caller(context);
        let record = self
            .executions()
            .lookup(&principal, task_id)
            .await
            .map_err(|error| ErrorData::internal_error(error.message().to_owned(), None))?
            .ok_or_else(no_such_task)?;
        let task = self.task_of(&record.execution_id);
        let Some(ended) = record.outcome else {
            return Ok(DetailedTask::new(task, TaskPayload::Working));
        };
        if ended.response.status == ExecutionStatus::Cancelled {
            return Ok(DetailedTask::new(task, TaskPayload::Cancelled));
        }
        let structured = settings
            .catalog
            .get_visible(&record.tool, principal.trust())
            .is_some_and(tools::has_structured_output);
        let outcome = Outcome {
            response: ended.response,
            replayed: false,
            retry_after: None,
        };
        // The result the call would have given, tool errors included (`isError`).
        let result = match answer(&outcome, structured)? {
            CallToolResponse::Complete(result) => serde_json::to_value(result).ok(),
            _ => None,
        };
        let Some(Value::Object(result)) = result else {
            return Err(ErrorData::internal_error("unreadable task result", None));
        };
        let payload = TaskPayload::Completed { result };
        Ok(DetailedTask::new(task, payload))
    }
}

/// The `tools/call {tool}` span of a call, in the caller's trace when its `_meta` carries a
/// W3C `traceparent`.
fn call_span(meta: &Map<String, Value>, tool: &str) -> tracing::Span {
    let parent = meta
        .get(TRACEPARENT_META_KEY)
        .and_then(Value::as_str)
        .and_then(TraceParent::parse);
    telemetry::mcp_span("tools/call", tool, parent.as_ref())
}

/// The runtime's call for a `tools/call`, and whether its tool answers with structured content;
/// or, for a malformed idempotency key, the error.
fn prepare(
    tool: String,
    arguments: Map<String, Value>,
    meta: &Map<String, Value>,
    principal: Principal,
    settings: &Settings,
) -> Result<(Call, bool), ToolError> {
    let request_id = request_id(meta)?;
    let structured = settings
        .catalog
        .get_visible(&tool, principal.trust())
        .is_some_and(tools::has_structured_output);
    let call = Call {
        catalog: Arc::clone(&settings.catalog),
        tool,
        arguments: Value::Object(arguments),
        request_id,
        principal,
        // MCP is spoken by agents' hosts only.
        requester: Requester::Agent,
    };
    Ok((call, structured))
}

fn no_such_task() -> ErrorData {
    ErrorData::invalid_params("no such task", None)
}

fn poll_interval_ms() -> u64 {
    u64::try_from(RETRY_AFTER.as_millis()).unwrap_or(u64::MAX)
}

/// Runs `execution`, sending its progress as `notifications/progress` before the answer.
async fn forward_progress(
    execution: impl Future<Output = Outcome>,
    mut receiver: EventReceiver,
    peer: &Peer<RoleServer>,
    token: ProgressToken,
) -> Outcome {
    let send = async |event: Event| {
        if let Event::Progress(progress) = event {
            let mut notification =
                ProgressNotificationParam::new(token.clone(), progress.progress as f64);
            notification.total = progress.total.map(|total| total as f64);
            notification.message = progress.message;
            // A client that is gone cancels the execution through the token; nothing to do.
            let _ = peer.notify_progress(notification).await;
        }
    };
    let mut execution = std::pin::pin!(execution);
    loop {
        tokio::select! {
            biased;
            outcome = &mut execution => return drain(outcome, &mut receiver, send).await,
            event = receiver.recv() => {
                // The execution keeps running while a slow client takes the notification:
                // the queue, not the client, bounds what waits.
                let mut sending = std::pin::pin!(send(event));
                tokio::select! {
                    biased;
                    () = &mut sending => {}
                    outcome = &mut execution => {
                        sending.await;
                        return drain(outcome, &mut receiver, send).await;
                    }
                }
            }
        }
    }
}

/// Sends the progress still queued, then gives back `outcome`: the answer comes last.
async fn drain<F: Future<Output = ()>>(
    outcome: Outcome,
    receiver: &mut EventReceiver,
    send: impl Fn(Event) -> F,
) -> Outcome {
    while let Some(event) = receiver.try_recv() {
        send(event).await;
    }
    outcome
}

/// The idempotency key from the call's `_meta`, checked like HTTP's `request_id`.
fn request_id(meta: &Map<String, Value>) -> Result<Option<String>, ToolError> {
    match meta.get(REQUEST_ID_META_KEY) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(request_id)) => {
            runtime::check_request_id(request_id)?;
            Ok(Some(request_id.clone()))
        }
        Some(_) => Err(ToolError::invalid_request(format!(
            "`_meta[\"{REQUEST_ID_META_KEY}\"]` must be a string"
        ))),
    }
}

/// The carmy/1 execution body as an MCP answer: `data` as structured content and text,
/// `error` as an `isError` result, an unknown tool as a protocol error (as MCP asks).
fn answer(outcome: &Outcome, structured: bool) -> Result<CallToolResponse, ErrorData> {
    let unreadable = || ErrorData::internal_error("unreadable execution body", None);
    let body: ExecutionBody<'_> =
        serde_json::from_slice(&outcome.response.body).map_err(|_| unreadable())?;
    // Sized once: the three below, `replayed` and, on a failure, the error.
    let mut meta = Map::with_capacity(5);
    for (key, value) in [
        ("dev.carmy/execution_id", body.execution_id),
        ("dev.carmy/status", body.status),
        ("dev.carmy/agent", body.agent),
    ] {
        if let Some(value) = value {
            meta.insert(key.to_owned(), value);
        }
    }
    meta.insert("dev.carmy/replayed".to_owned(), outcome.replayed.into());
    if let Some(error) = body.error {
        if outcome.response.code.as_deref() == Some(codes::TOOL_NOT_FOUND) {
            let message = error["message"]
                .as_str()
                .unwrap_or("unknown tool")
                .to_owned();
            return Err(ErrorData::invalid_params(message, Some(error)));
        }
        return Ok(failure(&error, meta).into());
    }
    // The text is the output as the tool's serializer wrote it into the body.
    let data = body.data.map_or("null", RawValue::get);
    let mut result = CallToolResult::success(vec![ContentBlock::text(data)]);
    if structured {
        result.structured_content = Some(serde_json::from_str(data).map_err(|_| unreadable())?);
    }
    result.meta = Some(MetaObject(meta));
    Ok(result.into())
}

/// The fields of a carmy/1 execution body (`protocol.md` §4) that its MCP answer carries,
/// read straight from the body rather than through a map of the whole; `data` is kept as
/// written.
#[derive(Deserialize)]
struct ExecutionBody<'a> {
    execution_id: Option<Value>,
    status: Option<Value>,
    #[serde(rename = "_agent")]
    agent: Option<Value>,
    #[serde(borrow)]
    data: Option<&'a RawValue>,
    error: Option<Value>,
}

/// The `isError` result of a call refused before it ran.
fn refused(error: &ToolError) -> CallToolResponse {
    let meta = Map::from_iter([("dev.carmy/replayed".to_owned(), false.into())]);
    failure(&json!(error), meta).into()
}

/// An `isError` result: the carmy error as text and under `_meta`, never as structured content.
fn failure(error: &Value, mut meta: Map<String, Value>) -> CallToolResult {
    meta.insert("dev.carmy/error".to_owned(), error.clone());
    let mut result = CallToolResult::error(vec![ContentBlock::text(error.to_string())]);
    result.meta = Some(MetaObject(meta));
    result
}
