-- wrk script: GET random aligned ranges of the benchmark's segment objects.
--
--   BENCH_RANGE_OBJECTS  file with one "/bucket/key size" line per object
--   BENCH_RANGE_BYTES    range length, also the alignment (default 1 MiB)
--
-- Each request picks an object and a whole range inside it uniformly at random
-- and asks `Range: bytes=start-(start+len-1)`. done() prints one line
-- "BENCH_JSON {...}" with the totals and latency percentiles (microseconds).
-- No response() callback: defining one makes wrk copy every 1 MiB body into Lua.

local range_bytes = tonumber(os.getenv("BENCH_RANGE_BYTES") or "1048576")
local objects = {}
local next_id = 0

function setup(thread)
   next_id = next_id + 1
   thread:set("thread_id", next_id)
end

function init(args)
   local path = os.getenv("BENCH_RANGE_OBJECTS")
   if not path then
      error("BENCH_RANGE_OBJECTS is not set")
   end
   for line in io.lines(path) do
      local key, size = line:match("^(%S+)%s+(%d+)%s*$")
      if key then
         local ranges = math.floor(tonumber(size) / range_bytes)
         if ranges > 0 then
            objects[#objects + 1] = { path = key, ranges = ranges }
         end
      end
   end
   if #objects == 0 then
      error("no object of at least one range in " .. path)
   end
   math.randomseed(os.time() * 1000 + (thread_id or 0) * 7919)
   for _ = 1, 10 do math.random() end
end

function request()
   local object = objects[math.random(#objects)]
   local start = (math.random(object.ranges) - 1) * range_bytes
   return wrk.format("GET", object.path, {
      ["Range"] = string.format("bytes=%d-%d", start, start + range_bytes - 1),
   })
end

function done(summary, latency, requests)
   local errors = summary.errors
   io.write(string.format(
      'BENCH_JSON {"requests":%d,"bytes":%d,"duration_us":%d,' ..
      '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
      '"latency_us":{"p50":%d,"p90":%d,"p99":%d,"max":%d,"mean":%.1f}}\n',
      summary.requests, summary.bytes, summary.duration,
      errors.connect, errors.read, errors.write, errors.status, errors.timeout,
      latency:percentile(50), latency:percentile(90), latency:percentile(99),
      latency.max, latency.mean))
end
