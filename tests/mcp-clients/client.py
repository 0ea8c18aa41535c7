"""Drives a carmy server over MCP with the official Python SDK, in one protocol generation.

Usage: `python client.py MODE URL` (Streamable HTTP) or `python client.py MODE --stdio COMMAND
ARG...` (a server started as a subprocess, speaking on its stdin and stdout), where MODE is
`2026-07-28` or `legacy` (the 2025-11-25 `initialize` handshake, with `Mcp-Session-Id` over
HTTP). Exits non-zero, naming the check, on the first failure.
"""

import asyncio
import json
import sys
import uuid

from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

REQUEST_ID = "dev.carmy/request_id"


def check(condition, what):
    if not condition:
        raise SystemExit(f"FAILED: {what}")
    print(f"ok: {what}")


async def run(mode: str, target: list[str]) -> None:
    if target[0] == "--stdio":
        server = StdioServerParameters(command=target[1], args=target[2:])
    else:
        server = streamable_http_client(target[0])
    async with Client(server, mode=mode) as client:
        check(client.protocol_version == ("2025-11-25" if mode == "legacy" else mode),
              f"negotiated {client.protocol_version}")

        listed = (await client.list_tools()).tools
        names = [tool.name for tool in listed]
        check(names == sorted(names), f"tools in a stable (name) order: {names}")
        tools = {tool.name: tool for tool in listed}
        check({"create_order", "get_order", "list_products", "cancel_order", "generate_report"} <= set(tools),
              "every shop tool listed")
        create = tools["create_order"]
        check(create.input_schema["type"] == "object" and "sku" in create.input_schema["properties"],
              "create_order has its input schema")
        check(create.output_schema is not None and "order_id" in create.output_schema["properties"],
              "create_order has its output schema")
        check(create.title == "Create order", "create_order has a title")
        check(create.description.startswith("Place an order."), "create_order has its description")
        annotations = create.annotations
        check(annotations.read_only_hint is False and annotations.destructive_hint is False
              and annotations.idempotent_hint is False and annotations.open_world_hint is False,
              "create_order annotations: a non-idempotent write")
        products = tools["list_products"].annotations
        check(products.read_only_hint is True and products.idempotent_hint is True, "list_products is read-only")
        cancel = tools["cancel_order"]
        check(cancel.annotations.destructive_hint is True, "cancel_order is destructive")
        check(cancel.meta["dev.carmy/tool"] == {"effect": "destructive", "idempotent": True,
                                                 "parallel_safe": True, "confirmation": "required"},
              "cancel_order carries carmy's metadata under _meta")

        read = await client.call_tool("list_products", {})
        check(not read.is_error, "list_products succeeds")
        skus = [product["sku"] for product in read.structured_content["products"]]
        check("KB-01" in skus, "list_products returns structured content")
        check(json.loads(read.content[0].text) == read.structured_content, "and the same as text")

        request_id = f"order-{uuid.uuid4()}"
        first = await client.call_tool("create_order", {"sku": "KB-01"}, meta={REQUEST_ID: request_id})
        again = await client.call_tool("create_order", {"sku": "KB-01"}, meta={REQUEST_ID: request_id})
        check(not first.is_error and not again.is_error, "create_order succeeds twice")
        order_id = first.structured_content["order_id"]
        check(again.structured_content == first.structured_content, "the retry returns the same order")
        check(again.meta["dev.carmy/replayed"] is True and first.meta["dev.carmy/replayed"] is False,
              "the retry is a replay")
        check(again.meta["dev.carmy/execution_id"] == first.meta["dev.carmy/execution_id"],
              "with the same execution id")
        fetched = await client.call_tool("get_order", {"order_id": order_id})
        check(fetched.structured_content["quantity"] == 1, "one order was placed, for one unit")

        conflict = await client.call_tool("create_order", {"sku": "MS-01"}, meta={REQUEST_ID: request_id})
        check(conflict.is_error and conflict.meta["dev.carmy/error"]["code"] == "IDEMPOTENCY_CONFLICT",
              "the same request id for another call is a conflict")

        progress = []

        async def on_progress(done, total, message):
            progress.append((done, total, message))

        report = await client.call_tool("generate_report", {"seconds": 1}, progress_callback=on_progress)
        check(not report.is_error and report.structured_content["seconds"] == 1, "generate_report completes")
        check([done for done, _, _ in progress] == [1, 2, 3, 4], f"progress 1..4 received: {progress}")
        check(progress[0][1] == 4 and progress[0][2] == "step 1 of 4", "progress carries total and message")

        bad = await client.call_tool("create_order", {"sku": 42})
        check(bad.is_error, "a bad call is an error result")
        check(bad.structured_content is None, "with no structured content")
        error = bad.meta["dev.carmy/error"]
        check(error["code"] == "INVALID_ARGUMENTS" and error["category"] == "validation"
              and error["retryable"] is False and error["details"]["errors"][0]["path"] == "/sku",
              "the carmy error is under _meta")
        check(json.loads(bad.content[0].text) == error, "and is the text")

        refused = await client.call_tool("cancel_order", {"order_id": order_id})
        check(refused.is_error and refused.meta["dev.carmy/error"]["code"] == "CONFIRMATION_REQUIRED",
              "cancel_order without confirmation is refused")
        still = await client.call_tool("get_order", {"order_id": order_id})
        check(still.structured_content["status"] == "placed", "and the order stands")

        try:
            await client.call_tool("no_such_tool", {})
        except MCPError as unknown:
            check(unknown.code == -32602 and unknown.error.data["code"] == "TOOL_NOT_FOUND",
                  "an unknown tool is a protocol error")
        else:
            check(False, "an unknown tool is a protocol error")


if __name__ == "__main__":
    # Give up rather than hang the test that runs this script.
    asyncio.run(asyncio.wait_for(run(sys.argv[1], sys.argv[2:]), timeout=60))
