--- lim:allow from Lua, for bench/lua/run.sh:
--
--     <lua> bench_allow.lua <seconds> [redis url]
--
-- Makes a limiter (in memory, or on the Redis at url), warms it up, then calls
-- lim:allow over 10,000 keys, round robin, for about <seconds> of wall time,
-- and prints "<calls> <seconds>". Every call is allowed (a bucket far larger
-- than the run can drain), so that neither refusals nor the deny cache make a
-- call cheaper than a real decision. Wall time comes from /proc/uptime
-- (10 ms steps: under 1% of a one-second run); it is read once every 1,000
-- calls.
local hirate = require "hirate"

local seconds = assert(tonumber(arg[1]), "usage: bench_allow.lua <seconds> [url]")
local url = arg[2]

local function now()
    local f = assert(io.open("/proc/uptime", "r"))
    local t = f:read("*n")
    f:close()
    return t
end

local lim = hirate.new { url = url, capacity = 1000000000, rate = 1000000000,
    prefix = "bench:lua:", timeout = 1, connect_timeout = 1 }
local keys = {}
for i = 1, 10000 do
    keys[i] = "user:" .. i
end

-- Warm-up: the buckets exist, the connection is open, the script is cached.
for i = 1, 10000 do
    local d = assert(lim:allow(keys[i]))
    assert(d.allowed and d.source == (url and "redis" or "local"), d.source)
end

local calls, i = 0, 0
local t0 = now()
local t1 = t0
repeat
    for _ = 1, 1000 do
        i = i < 10000 and i + 1 or 1
        lim:allow(keys[i])
    end
    calls = calls + 1000
    t1 = now()
until t1 - t0 >= seconds
-- One more decision, checked: the loop did what it claims.
local d = assert(lim:allow(keys[1]))
assert(d.allowed and d.source == (url and "redis" or "local"), d.source)
lim:close()
print(calls, t1 - t0)
