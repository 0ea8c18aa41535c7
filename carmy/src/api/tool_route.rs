//! `POST /agent/tools/{name}` (`protocol.md` §11): one route per tool, as the OpenAPI document
//! describes it, that answers exactly as `/agent/execute` does.

use axum::extract::{FromRequestParts, Path, Request, State};
use axum::response::Response;
use serde_json::{Value, json};

use super::execute::{self, Caller, ExecuteState};
use crate::http::requester::requester;
use crate::runtime::{self, Call};
use crate::tool_error::ToolError;

/// The tool named in the path, called with the body as its arguments and the
/// `Idempotency-Key` header as its request id; then the execute pipeline. The body is declared
/// `application/json`, empty or not (an empty one is `{}`): any other type is what a page on
/// another site may send without a preflight (a form, `text/plain`), refused before it is read.
pub(crate) async fn call_tool(State(state): State<ExecuteState>, request: Request) -> Response {
    let (mut parts, body) = request.into_parts();
    let caller = Caller::of(&mut parts, &state.current);
    let (present, secured) = (caller.present, caller.secured);
    let call = async {
        let Path(tool) = Path::<String>::from_request_parts(&mut parts, &())
            .await
            .map_err(|_| ToolError::invalid_request("the tool name in the path is not valid"))?;
        execute::require_json(&parts.headers)?;
        let bytes = execute::read_body(body).await?;
        let arguments: Value = if bytes.is_empty() {
            json!({})
        } else {
            execute::parse_body(&bytes)?
        };
        let request_id = execute::idempotency_key(&parts.headers, present)?;
        if let Some(request_id) = &request_id {
            runtime::check_request_id(request_id)?;
        }
        Ok::<_, ToolError>(Call {
            tool,
            arguments,
            request_id,
            principal: caller.principal,
            requester: requester(&parts.headers, present)?,
            catalog: caller.catalog,
        })
    };
    match call.await {
        Ok(call) => {
            let wanted = execute::Wanted::of(&parts.headers, present);
            execute::answer(state, wanted, call, secured).await
        }
        Err(error) => crate::http::error::answer(&error, secured),
    }
}
