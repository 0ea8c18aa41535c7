-- wrk -s tests/wrk/mcp.lua http://127.0.0.1:3000/mcp: the same call as a 2026-07-28 tools/call.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Accept"] = "application/json, text/event-stream"
wrk.headers["MCP-Protocol-Version"] = "2026-07-28"
wrk.headers["Mcp-Method"] = "tools/call"
wrk.headers["Mcp-Name"] = "list_products"
wrk.body = '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"list_products","arguments":{},'
  .. '"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}'
