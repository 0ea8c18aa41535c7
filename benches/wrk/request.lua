-- One request shape for wrk, from the environment:
--   BENCH_METHOD, BENCH_PATH, BENCH_BODY (a "{id}" in it becomes a value unique per request),
--   BENCH_HEADERS ("Name: value" lines).
local method = os.getenv("BENCH_METHOD") or "GET"
local path = os.getenv("BENCH_PATH") or "/"
local body_template = os.getenv("BENCH_BODY")
local headers = {}
for line in string.gmatch(os.getenv("BENCH_HEADERS") or "", "[^\n]+") do
  local name, value = string.match(line, "^([^:]+):%s*(.*)$")
  if name then headers[name] = value end
end

local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("thread_id", threads)
end

local counter = 0
local unique = body_template ~= nil and string.find(body_template, "{id}", 1, true) ~= nil
local fixed = nil

function request()
  if not unique then
    if fixed == nil then fixed = wrk.format(method, path, headers, body_template) end
    return fixed
  end
  counter = counter + 1
  local id = string.format("t%d-%d", thread_id, counter)
  local body = string.gsub(body_template, "{id}", id)
  return wrk.format(method, path, headers, body)
end

function done(summary, latency, requests)
  io.write(string.format("non2xx: %d\n", summary.errors.status))
end

-- BENCH_REQUESTS (memory at equal work): stop once that many answers have arrived. Only then is
-- a response callback defined, since wrk parses every answer for Lua when one is.
local limit = tonumber(os.getenv("BENCH_REQUESTS") or "0")
if limit > 0 then
  local answered = 0
  function response(status, headers, body)
    answered = answered + 1
    if answered >= limit then os.exit(0) end
  end
end
