--- lim:allow a given number of times, for instruction counts under callgrind
-- (bench/lua/run.sh):
--
--     <lua> calls.lua <calls> [redis url]
--
-- Makes the limiter of common.lua over 1,000 keys (warmed up: every bucket
-- exists; on Redis the script is cached and the connection open), then calls
-- lim:allow <calls> times over those keys, round robin. run.sh subtracts the
-- count of a run with 0 calls, which leaves the instructions of the calls
-- alone.
local calls = assert(tonumber(arg[1]), "usage: calls.lua <calls> [url]")
local url = arg[2]

local lim, keys = dofile(arg[0]:match("^(.*)/") .. "/common.lua")(url, 1000,
    "bench:lua-calls:")
local n, i = #keys, 0
for _ = 1, calls do
    i = i < n and i + 1 or 1
    lim:allow(keys[i])
end
lim:close()
