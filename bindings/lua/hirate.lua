--- hirate: a distributed token-bucket rate limiter for Lua 5.1-5.4, LuaJIT
-- and OpenResty.
--
--     local hirate = require "hirate"
--     local lim = hirate.new{ url = "redis://127.0.0.1:6379", capacity = 10, rate = 2 }
--     -- or several limits on each key, decided all or nothing:
--     --   hirate.new{ url = ..., limits = "10/second; 1000/day" }
--     local d, err, code = lim:allow("alice")
--     if not d then ... err, e.g. a wrong password (code "EAUTH")
--     elseif d.allowed then ... serve
--     else ... refuse; retry in d.retry_after seconds
--
-- In plain Lua, hirate.new returns the C limiter of hirate.core, which does
-- its Redis I/O with the core's blocking client. Inside OpenResty (where the
-- global ngx exists) it returns the cosocket-backed limiter of hirate.resty,
-- which answers the same calls without ever blocking the nginx worker. See
-- docs/lua.md.

local core = require "hirate.core"

local hirate = {
    _VERSION = core._VERSION,
    _NAME = "hirate",
    script_source = core.script_source,
    script_sha1 = core.script_sha1,
    -- The same script as a Redis Functions library, and its function's name
    -- (FUNCTION LOAD, FCALL).
    function_library = core.function_library,
    function_name = core.function_name,
    version = core.version,
    -- "10/second; 1000/day" as the core reads it: an array of
    -- {capacity=, rate=, count=, window=} (docs/semantics.md, "Limit strings").
    parse_limits = core.parse_limits,
    -- Whole seconds an empty bucket of capacity takes to fill at rate,
    -- rounded up: the "w" of a RateLimit-Policy header, the core's.
    refill_seconds = core.refill_seconds,
    -- nil, or the message of the error a call raises for a key or a cost:
    -- the core's rules and words, for code that checks before it calls.
    key_error = core.key_error,
    cost_error = core.cost_error,
    -- The core's limits: a key's bytes, a prefix's bytes, and the largest
    -- capacity or cost (2^53-1, exact in every Lua).
    KEY_MAX = core.KEY_MAX,
    PREFIX_MAX = core.PREFIX_MAX,
    EXACT_MAX = core.EXACT_MAX,
    -- The most bands (limits) one limiter has.
    BANDS_MAX = core.BANDS_MAX,
}

-- Chosen once, when the module is loaded: a module loaded by nginx's Lua sees
-- ngx in every phase, plain Lua never does. rawget, so that a strict-globals
-- checker does not object to the probe.
if rawget(_G, "ngx") ~= nil then
    hirate.new = require("hirate.resty").new
else
    hirate.new = core.new
end

return hirate
