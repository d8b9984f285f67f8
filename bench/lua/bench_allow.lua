--- lim:allow from Lua, for bench/lua/run.sh:
--
--     <lua> bench_allow.lua <seconds> [redis url]
--
-- Makes the limiter of common.lua over 10,000 keys (in memory, or on the
-- Redis at url; warmed up, every call allowed), then calls lim:allow over
-- them, round robin, for about <seconds> of wall time, and prints
-- "<calls> <seconds>". Wall time comes from /proc/uptime
-- (10 ms steps: under 1% of a one-second run); it is read once every 1,000
-- calls.
local seconds = assert(tonumber(arg[1]), "usage: bench_allow.lua <seconds> [url]")
local url = arg[2]

local function now()
    local f = assert(io.open("/proc/uptime", "r"))
    local t = f:read("*n")
    f:close()
    return t
end

local lim, keys, check = dofile(arg[0]:match("^(.*)/") .. "/common.lua")(url, 10000,
    "bench:lua:")

local n, calls, i = #keys, 0, 0
local t0 = now()
local t1 = t0
repeat
    for _ = 1, 1000 do
        i = i < n and i + 1 or 1
        lim:allow(keys[i])
    end
    calls = calls + 1000
    t1 = now()
until t1 - t0 >= seconds
-- One more decision, checked: the loop did what it claims.
check(lim:allow(keys[1]))
lim:close()
print(calls, t1 - t0)
