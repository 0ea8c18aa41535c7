"""Drives carmy's MCP tasks (the 2026-07-28 tasks extension) with the official Python SDK, and
reads the same executions over HTTP.

Usage: `python tasks.py URL TOKEN OTHER_TOKEN`: URL is the server's `/mcp`, TOKEN and
OTHER_TOKEN bearer tokens of two identified callers (an anonymous caller gets no tasks).
Exits non-zero, naming the check, on the first failure.

The SDK (2.3.0) has the extension API but not the tasks extension itself, so this script is
that extension, built from the SDK's parts: `TasksExtension` advertises
`io.modelcontextprotocol/tasks` and claims the `resultType: "task"` answer of `tools/call`
(`ResultClaim`); `Client.call_tool` resolves it by polling, `ClientSession.call_tool(...,
allow_claimed=True)` hands it over as is. `tasks/get` and `tasks/cancel` go through
`ClientSession.send_request` as the SDK's own `GetTaskRequest` and `CancelTaskRequest` (their
params are the same on both wires), subclassed only to name `taskId` as their `name_param`:
the SDK's classes leave it unset, so sent as they are they carry no `Mcp-Name` header and the
server refuses them. Their answers are read into the models below: the SDK's task results
are the 2025-11-25 shapes (`ttl`, a nested `task`), which do not parse the 2026-07-28 ones.
"""

import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Literal

import httpx2
from mcp import Client
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INVALID_PARAMS,
    CallToolResult,
    CancelTaskRequest,
    CancelTaskRequestParams,
    EmptyResult,
    GetTaskRequest,
    GetTaskRequestParams,
    Result,
    TaskStatus,
)

TASKS = "io.modelcontextprotocol/tasks"


def check(condition, what):
    if not condition:
        raise SystemExit(f"FAILED: {what}")
    print(f"ok: {what}")


class TaskState(Result):
    """A task on the 2026-07-28 wire: its fields at the top level of the result."""

    task_id: str
    status: TaskStatus
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    ttl_ms: int | None = None
    poll_interval_ms: int | None = None


class CreatedTask(TaskState):
    """The answer of a `tools/call` the server runs as a task."""

    result_type: Literal["task"]


class DetailedTask(TaskState):
    """The answer of `tasks/get`: once `completed`, the `tools/call` result."""

    result_type: str = "complete"
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


class GetTask(GetTaskRequest):
    """`tasks/get`, naming its task in `Mcp-Name`."""

    name_param = "taskId"


class CancelTask(CancelTaskRequest):
    """`tasks/cancel`, naming its task in `Mcp-Name`."""

    name_param = "taskId"


async def get_task(session: ClientSession, task_id: str) -> DetailedTask:
    return await session.send_request(GetTask(params=GetTaskRequestParams(task_id=task_id)), DetailedTask)


async def cancel_task(session: ClientSession, task_id: str) -> None:
    await session.send_request(CancelTask(params=CancelTaskRequestParams(task_id=task_id)), EmptyResult)


async def until_done(session: ClientSession, task: TaskState) -> DetailedTask:
    """Polls `tasks/get` at the interval the server asks for until the task leaves `working`."""
    while True:
        await asyncio.sleep((task.poll_interval_ms or 1000) / 1000)
        task = await get_task(session, task.task_id)
        if task.status != "working":
            return task


async def resolve(created: CreatedTask, context: ClaimContext) -> CallToolResult:
    """Finishes a claimed task for `Client.call_tool`: its result, once completed."""
    done = await until_done(context.session, created)
    if done.status != "completed" or done.result is None:
        raise RuntimeError(f"task {done.task_id} ended {done.status}")
    return CallToolResult.model_validate(done.result)


class TasksExtension(ClientExtension):
    """Advertises the tasks extension and claims the task answer of `tools/call`."""

    identifier = TASKS

    def claims(self):
        return [ResultClaim(result_type="task", model=CreatedTask, resolve=resolve)]


def bearer(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


@asynccontextmanager
async def connect(url: str, token: str | None, *, tasks: bool) -> AsyncIterator[Client]:
    """A client of the caller `token` names (anonymous without one), settling on 2026-07-28 by
    `server/discover`; with `tasks`, one that takes tasks."""
    async with httpx2.AsyncClient(headers=bearer(token)) as http, \
            Client(streamable_http_client(url, http_client=http), mode="auto",
                   extensions=[TasksExtension()] if tasks else None) as client:
        yield client


async def run(url: str, token: str, other_token: str) -> None:
    origin = url.removesuffix("/mcp")
    http = httpx2.AsyncClient(base_url=origin, headers=bearer(token))
    async with http, connect(url, token, tasks=True) as client, connect(url, token, tasks=False) as plain, \
            connect(url, other_token, tasks=True) as other, connect(url, None, tasks=True) as anonymous:
        check(client.protocol_version == "2026-07-28", f"negotiated {client.protocol_version}")
        check(TASKS in (client.server_capabilities.extensions or {}), "the server declares the tasks extension")
        report = {"seconds": 2}
        synchronous = await plain.call_tool("generate_report", report)
        check(not synchronous.is_error and synchronous.structured_content["seconds"] == 2,
              "a client that does not take tasks gets the report synchronously")

        answered = await anonymous.session.call_tool("generate_report", {"seconds": 1}, allow_claimed=True)
        check(isinstance(answered, CallToolResult) and answered.structured_content["seconds"] == 1,
              "an anonymous caller that takes tasks gets the report synchronously")

        started = await client.session.call_tool("generate_report", report, allow_claimed=True)
        check(isinstance(started, CreatedTask), f"a client that takes tasks gets a task: {started!r}")
        task_id = started.task_id
        check(task_id.startswith("exec_") and started.status == "working",
              f"the task is the execution {task_id}, working")
        working = await get_task(client.session, task_id)
        check(working.status == "working" and working.result is None, "tasks/get says working")

        try:
            await get_task(other.session, task_id)
        except MCPError as unknown:
            check(unknown.code == INVALID_PARAMS, f"another caller's tasks/get is an unknown task: {unknown}")
        else:
            check(False, "another caller's tasks/get is an unknown task")

        done = await until_done(client.session, working)
        check(done.status == "completed" and done.result is not None, "tasks/get says completed")
        result = CallToolResult.model_validate(done.result)
        check(not result.is_error and result.structured_content == synchronous.structured_content,
              f"with the result a synchronous call gives: {result.structured_content}")
        check(result.content == synchronous.content, "as text too")
        check(result.meta["dev.carmy/execution_id"] == task_id, "naming the execution")

        over_http = await http.get(f"/agent/executions/{task_id}")
        check(over_http.status_code == 200, f"GET /agent/executions/{{taskId}} answers {over_http.status_code}")
        execution = over_http.json()
        check(execution["execution_id"] == task_id and execution["status"] == "completed"
              and execution["data"] == result.structured_content,
              f"over HTTP it is the same finished execution: {execution}")
        others = await http.get(f"/agent/executions/{task_id}", headers=bearer(other_token))
        check(others.status_code == 404, "and another caller's GET finds nothing")

        resolved = await client.call_tool("generate_report", report)
        check(resolved.structured_content == synchronous.structured_content,
              "Client.call_tool resolves the task through the extension's claim")
        # Only an execution run detached is kept (a synchronous one without a request id is not).
        kept = await http.get(f"/agent/executions/{resolved.meta['dev.carmy/execution_id']}")
        not_kept = await http.get(f"/agent/executions/{synchronous.meta['dev.carmy/execution_id']}")
        check(kept.status_code == 200 and not_kept.status_code == 404, "as a task: the execution is kept")

        long = await client.session.call_tool("generate_report", {"seconds": 10}, allow_claimed=True)
        check(isinstance(long, CreatedTask), "a long report is a task")
        running = (await http.get(f"/agent/executions/{long.task_id}")).json()
        check(running["status"] == "running", f"running over HTTP: {running}")
        await cancel_task(client.session, long.task_id)
        cancelled = await until_done(client.session, long)
        check(cancelled.status == "cancelled" and cancelled.result is None, "tasks/cancel cancels it")
        execution = (await http.get(f"/agent/executions/{long.task_id}")).json()
        check(execution["status"] == "cancelled" and execution["error"]["code"] == "CANCELLED",
              f"and over HTTP it is cancelled: {execution}")


if __name__ == "__main__":
    # Give up rather than hang the test that runs this script (say, polling a task that never ends).
    try:
        asyncio.run(asyncio.wait_for(run(*sys.argv[1:]), timeout=60))
    except TimeoutError:
        raise SystemExit("FAILED: gave up after 60 s") from None
