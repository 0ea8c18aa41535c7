-- wrk script: POST /agent/execute of the shop's create_order, each call with a fresh
-- request_id, so every call reserves and records in the idempotency store.
--   wrk -t2 -c32 -d10s -s bench/execute_with_request_id.lua http://127.0.0.1:3000
local threads = 0

function setup(thread)
  thread:set("thread", threads)
  threads = threads + 1
end

function init(args)
  prefix = (args[1] or tostring(os.time())) .. "-" .. tostring(thread)
  calls = 0
end

function request()
  calls = calls + 1
  local body = string.format(
    '{"tool":"create_order","arguments":{"sku":"KB-01"},"request_id":"bench-%s-%d"}',
    prefix, calls)
  return wrk.format("POST", "/agent/execute", { ["Content-Type"] = "application/json" }, body)
end
