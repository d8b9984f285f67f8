-- The Lua 5.4 worker of the invariants-under-load test (test_invariants.py):
-- one plain-Lua process spending from the same Redis key as the C and Python
-- workers, through require "hirate" and the core's blocking client.
--
--   lua5.4 load_worker.lua NAME URL PREFIX KEY CAPACITY RATE SECONDS THREADS DRAIN TIMEOUT_MS LOG
--
-- (THREADS must be 1: a Lua state is one thread.) It prints "ready NAME",
-- waits for a line on stdin, calls allow() with costs 1 to 3 until SECONDS
-- have passed on Redis' clock (or, with DRAIN 1, until a decision shows the
-- bucket empty), and writes its log in load_worker.c's format. The deny cache
-- is off, so every call is a round trip and the process paces itself on
-- Redis.
--
-- With HIRATE_TLS_CA_FILE set, a rediss:// URL is verified against that CA
-- (the invariants' run over TLS). With HIRATE_LOG_DECISIONS=1 (the failover
-- test, test_failover.py) the log also gets load_worker.c's line for every
-- decision, with the limiter's master_changes counter before and after it:
--
--   D <name> <thread> <source> <time_us|-> <allowed> <cost> <mc_before> <mc_after>
--
-- Plain Lua has no wall clock finer than a second, so a call the policy
-- answered is logged with the Redis times around it: the last one seen
-- before the call and the first one after it (0 and "inf" when there is
-- none), which bound its interval as the other workers' clocks do. The calls
-- between the same two Redis times share that interval, so they are logged
-- as one line with their costs added up: while the breaker keeps Redis alone
-- the policy answers at once, and there are many.

local name, url, prefix, key, capacity, rate, seconds, threads, drain, timeout_ms, log_path =
    table.unpack(arg, 1, 11)
assert(log_path and tonumber(threads) == 1, "usage: see the comment at the top")

local hirate = require "hirate"

local timeout = tonumber(timeout_ms) / 1000
local ca = os.getenv("HIRATE_TLS_CA_FILE")
local lim = hirate.new {
    url = url, prefix = prefix, capacity = math.tointeger(tonumber(capacity)),
    rate = tonumber(rate), on_error = "closed", deny_cache = false,
    timeout = timeout, connect_timeout = timeout,
    tls_ca_file = ca ~= "" and ca or nil,
}
drain = drain == "1"
seconds = tonumber(seconds)
local log_decisions = os.getenv("HIRATE_LOG_DECISIONS") == "1"

-- The core's counter ("-" where this build's _stats() lacks it).
local function master_changes()
    local n = lim:_stats().master_changes
    return n and string.format("%d", n) or "-"
end

-- Whole microseconds from the decision's seconds (one rounding away).
local function us(t)
    return string.format("%.0f", t * 1e6)
end

io.write("ready ", name, "\n")
io.flush()
assert(io.read("l"), "no start signal")

-- A seed of our own: two workers started in the same second must differ.
do
    local f = assert(io.open("/dev/urandom", "rb"))
    local b = f:read(4)
    f:close()
    math.randomseed(string.unpack("<I4", b))
end

local events = {}
local pending = nil   -- { since, cost, error } of the policy's calls since the last Redis time
local n = { decisions = 0, admitted = 0, admitted_cost = 0, refused = 0, redis = 0, cache = 0,
    policy = 0 }
local started_os = os.time()
local first, last_redis, failed = nil, "0", nil

while os.time() - started_os <= seconds + 2 do
    local cost = math.random(1, 3)
    local mc1 = log_decisions and master_changes()
    local d, err, code = lim:allow(key, cost)
    if not d then
        failed = ("%s: %s"):format(code, err)
        break
    end
    if log_decisions then
        events[#events + 1] = ("D %s 0 %s %s %d %d %s %s"):format(name, d.source,
            d.source == "redis" and us(d.time) or "-", d.allowed and 1 or 0, cost, mc1,
            master_changes())
    end
    n.decisions = n.decisions + 1
    if d.error then
        n.policy = n.policy + 1
        pending = pending or { last_redis, 0, d.error }
        pending[2] = pending[2] + cost
    else
        n[d.source] = n[d.source] + 1
        local t = us(d.time)
        if pending then
            events[#events + 1] = ("P %s %s %d %s"):format(pending[1], t, pending[2], pending[3])
            pending = nil
        end
        last_redis = t
        first = first or d.time
        if d.allowed then
            n.admitted = n.admitted + 1
            n.admitted_cost = n.admitted_cost + cost
            events[#events + 1] = ("A %s %d"):format(t, cost)
        else
            n.refused = n.refused + 1
            if drain and d.remaining == 0 then
                break
            end
        end
        if d.time - first >= seconds then
            break
        end
    end
end
if pending then
    events[#events + 1] = ("P %s inf %d %s"):format(pending[1], pending[2], pending[3])
end
local mc_final = log_decisions and master_changes() or "-"
mc_final = mc_final == "-" and "" or (" master_changes=" .. mc_final)
lim:close()

local log = assert(io.open(log_path, "w"))
for _, line in ipairs(events) do
    log:write(line, "\n")
end
log:write(("S %s threads=1 decisions=%d admitted=%d admitted_cost=%d refused=%d redis=%d "
    .. "cache=%d policy=%d errors=%d%s\n"):format(name, n.decisions, n.admitted, n.admitted_cost,
    n.refused, n.redis, n.cache, n.policy, failed and 1 or 0, mc_final))
assert(log:close())
if failed then
    io.stderr:write("load_worker.lua ", name, ": ", failed, "\n")
    os.exit(1)
end
