-- wrk -s tests/wrk/execute.lua http://127.0.0.1:3000/agent/execute: list_products over carmy/1.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"tool":"list_products","arguments":{}}'
