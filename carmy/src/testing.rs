//! An in-process client for tool authors: call a tool by name, through the same pipeline as
//! HTTP (validation, confirmation, idempotency, deadlines), so a tool's tests sit next to it.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use carmy::testing::Client;
//! use serde_json::json;
//!
//! /// Adds one.
//! #[carmy::tool(effect = "none", register = false)]
//! async fn increment(input: Number) -> Result<Number, carmy::ToolError> {
//!     Ok(Number { value: input.value + 1 })
//! }
//!
//! #[derive(serde::Deserialize, serde::Serialize, carmy::JsonSchema)]
//! struct Number { value: i64 }
//!
//! let client = Client::new(carmy::App::new().tool(increment::TOOL)).unwrap();
//! let answer = client.call("increment", json!({ "value": 41 })).await;
//! assert_eq!(answer.data(), &json!({ "value": 42 }));
//! # }
//! ```

use std::fmt;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::Arc;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::app::App;
use crate::context::{Principal, Requester};
use crate::error::Error;
use crate::executions::{CANCEL_SETTLES_WITHIN, Cancelled};
use crate::runtime::{self, Answer, Call, Delivery, Outcome, Runtime};
use crate::settings::Current;
use crate::status::ExecutionStatus;

/// Calls an app's tools in-process.
#[derive(Debug, Clone)]
pub struct Client {
    runtime: Arc<Runtime>,
    current: Current,
}

impl Client {
    /// Builds `app` (with the same checks as [`App::router`]).
    pub fn new(app: App) -> Result<Self, Error> {
        let built = app.build()?;
        Ok(Client {
            runtime: built.runtime,
            current: built.current,
        })
    }

    /// Prepares a call of `tool`; `.await` it, optionally after setting a request id or the
    /// caller.
    pub fn call(&self, tool: &str, arguments: Value) -> PendingCall<'_> {
        PendingCall {
            client: self,
            tool: tool.to_owned(),
            arguments,
            request_id: None,
            principal: Principal::anonymous(),
            requester: Requester::Agent,
        }
    }

    /// Waits for `principal`'s execution `execution_id` to end and returns its answer, as
    /// `GET /agent/executions/{id}` reads it; `None` when it is not theirs (or does not exist).
    pub async fn wait(&self, principal: &Principal, execution_id: &str) -> Option<Response> {
        let executions =
            crate::executions::Executions::new(Arc::clone(self.runtime.execution_store()));
        loop {
            let record = executions.lookup(principal, execution_id).await.ok()??;
            if let Some(ended) = record.outcome {
                return Some(Response::of(&Outcome {
                    response: ended.response,
                    replayed: false,
                    retry_after: None,
                }));
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    /// Asks for `principal`'s running execution to be cancelled, as `DELETE` does: `true` when
    /// the cancellation took effect (it ended cancelled, or still runs a few seconds later),
    /// `false` when it has ended otherwise or is not theirs.
    pub async fn cancel(&self, principal: &Principal, execution_id: &str) -> bool {
        let executions =
            crate::executions::Executions::new(Arc::clone(self.runtime.execution_store()));
        let cancelled = executions
            .cancel_settled(principal, execution_id, CANCEL_SETTLES_WITHIN)
            .await;
        matches!(cancelled, Ok(Cancelled::Accepted(_)))
    }
}

/// A call being prepared; `.await` runs it.
#[must_use = "a call does nothing until awaited"]
#[derive(Debug)]
pub struct PendingCall<'a> {
    client: &'a Client,
    tool: String,
    arguments: Value,
    request_id: Option<String>,
    principal: Principal,
    requester: Requester,
}

impl PendingCall<'_> {
    /// Sends a `request_id`, as a client that may retry does.
    pub fn request_id(mut self, request_id: impl Into<String>) -> Self {
        self.request_id = Some(request_id.into());
        self
    }

    /// Calls as `principal` instead of the anonymous caller.
    pub fn principal(mut self, principal: Principal) -> Self {
        self.principal = principal;
        self
    }

    /// Calls as `requester` (what [`Context::requester`](crate::Context::requester) tells the
    /// tool) instead of an agent.
    pub fn requester(mut self, requester: Requester) -> Self {
        self.requester = requester;
        self
    }
}

impl PendingCall<'_> {
    /// Starts the call asynchronously, as `Prefer: respond-async` does: `Ok` with the
    /// execution id when it runs detached (read it back with [`Client::wait`]), `Err` with the
    /// answer when it was answered at once (a rejection, a replay, a `mode = "sync"` tool, an
    /// anonymous caller).
    pub async fn start(self) -> Result<String, Response> {
        let (runtime, call) = self.into_call()?;
        let delivery = Delivery {
            cancel: None,
            events: None,
            prefer_async: true,
        };
        match runtime.call(call, delivery).await {
            Answer::Accepted(accepted) => Ok(accepted.execution_id.to_string()),
            Answer::Outcome(outcome) => Err(Response::of(&outcome)),
        }
    }

    /// The runtime and the call, or the answer to a malformed `request_id`.
    fn into_call(self) -> Result<(Arc<Runtime>, Call), Response> {
        if let Some(Err(error)) = self.request_id.as_deref().map(runtime::check_request_id) {
            return Err(Response {
                status: ExecutionStatus::Failed,
                body: serde_json::json!({ "error": error }),
                replayed: false,
            });
        }
        let call = Call {
            catalog: Arc::clone(&self.client.current.load().catalog),
            tool: self.tool,
            arguments: self.arguments,
            request_id: self.request_id,
            principal: self.principal,
            requester: self.requester,
        };
        Ok((Arc::clone(&self.client.runtime), call))
    }
}

impl<'a> IntoFuture for PendingCall<'a> {
    type Output = Response;
    type IntoFuture = Pin<Box<dyn Future<Output = Response> + Send + 'a>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let (runtime, call) = match self.into_call() {
                Ok(prepared) => prepared,
                Err(answer) => return answer,
            };
            Response::of(&runtime.execute(call, CancellationToken::new(), None).await)
        })
    }
}

/// The answer to a call: the body an HTTP client would get, parsed.
///
/// Its `Debug` and `Display` lead with the outcome (`failed: OUT_OF_STOCK: MS-01 is out of
/// stock`), so a failed assertion says why the call failed.
#[derive(Clone, PartialEq)]
pub struct Response {
    /// How the execution ended.
    pub status: ExecutionStatus,
    /// The whole response body (`execution_id`, `status`, `data` or `error`, `_agent`).
    pub body: Value,
    /// Whether this is a recorded answer replayed for a repeated `request_id`.
    pub replayed: bool,
}

impl Response {
    fn of(outcome: &Outcome) -> Self {
        Response {
            status: outcome.response.status,
            body: serde_json::from_slice(&outcome.response.body)
                .expect("execution bodies are JSON"),
            replayed: outcome.replayed,
        }
    }

    /// The tool's output.
    ///
    /// # Panics
    ///
    /// When the call did not complete, with the error's code and message.
    #[track_caller]
    pub fn data(&self) -> &Value {
        match self.body.get("data") {
            Some(data) if self.status == ExecutionStatus::Completed => data,
            _ => panic!("the call has no data: {self}"),
        }
    }

    /// The error code, when the call did not complete.
    pub fn error_code(&self) -> Option<&str> {
        self.body["error"]["code"].as_str()
    }

    /// The error message, when the call did not complete.
    pub fn error_message(&self) -> Option<&str> {
        self.body["error"]["message"].as_str()
    }
}

impl fmt::Display for Response {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let replayed = if self.replayed { " (replayed)" } else { "" };
        match (self.status, self.error_code()) {
            (ExecutionStatus::Completed, _) => {
                write!(f, "completed{replayed}: {}", self.body["data"])
            }
            (status, Some(code)) => write!(
                f,
                "{}{replayed}: {code}: {}",
                status.as_str(),
                self.error_message().unwrap_or_default()
            ),
            (status, None) => write!(f, "{}{replayed}: {}", status.as_str(), self.body),
        }
    }
}

impl fmt::Debug for Response {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Response")
            .field("outcome", &format_args!("{self}"))
            .field("body", &self.body)
            .finish()
    }
}
