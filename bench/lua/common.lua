--- What bench_allow.lua and calls.lua share (each loads it with dofile):
--
--     local lim, keys, check = dofile(dir .. "/common.lua")(url, nkeys, prefix)
--
-- A limiter in memory, or on the Redis at url, whose bucket is far larger
-- than a run can drain, so that every call is a real, allowed decision
-- (neither a refusal nor the deny cache makes one cheaper); nkeys keys
-- "user:N", each decided once already, so that every bucket exists and, on
-- Redis, the connection is open and the script cached; and check(d), which
-- asserts that a decision is such an allowed one.
local hirate = require "hirate"

return function(url, nkeys, prefix)
    local lim = hirate.new { url = url, capacity = 1000000000, rate = 1000000000,
        prefix = prefix, timeout = 1, connect_timeout = 1 }
    local source = url and "redis" or "local"
    local function check(d, err)
        assert(d, err)
        assert(d.allowed and d.source == source, d.source)
    end
    local keys = {}
    for i = 1, nkeys do
        keys[i] = "user:" .. i
    end
    for i = 1, nkeys do
        check(lim:allow(keys[i]))
    end
    return lim, keys, check
end
