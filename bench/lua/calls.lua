--- lim:allow a given number of times, for instruction counts under callgrind
-- (bench/lua/run.sh):
--
--     <lua> calls.lua <calls> [redis url]
--
-- Makes the limiter bench_allow.lua makes, warms it up (every one of 1,000
-- keys has its bucket; on Redis the script is cached and the connection
-- open), then calls lim:allow <calls> times over those keys, round robin.
-- run.sh subtracts the count of a run with 0 calls, which leaves the
-- instructions of the calls alone.
local hirate = require "hirate"

local calls = assert(tonumber(arg[1]), "usage: calls.lua <calls> [url]")
local url = arg[2]

local lim = hirate.new { url = url, capacity = 1000000000, rate = 1000000000,
    prefix = "bench:lua-calls:", timeout = 1, connect_timeout = 1 }
local keys = {}
for i = 1, 1000 do
    keys[i] = "user:" .. i
end
for i = 1, 1000 do
    local d = assert(lim:allow(keys[i]))
    assert(d.allowed and d.source == (url and "redis" or "local"), d.source)
end

local i = 0
for _ = 1, calls do
    i = i < 1000 and i + 1 or 1
    lim:allow(keys[i])
end
lim:close()
