--[[
hirate.headers: the response headers that describe a decision (RateLimit,
RateLimit-Policy, the legacy X-RateLimit-*, Retry-After), its status and the
refusal's text. They are the core's (hirate_response_format, through
hirate.core.response), as the Python integrations send them: this module
only hands it a limiter's bands and decisions. What each case shows is in
docs/semantics.md, "Response headers".
]]

local floor, format, tostring, type, ipairs, error, pcall = math.floor, string.format, tostring,
    type, ipairs, error, pcall

local core = require "hirate.core"

local _M = {
    RATELIMIT = core.HEADERS_RATELIMIT,
    LEGACY = core.HEADERS_LEGACY,
    --- response(limits, d, flags) -> status, retry_after, RateLimit-Policy,
    --- RateLimit, X-RateLimit-Limit, -Remaining, -Reset, Retry-After, text
    --- (each nil when not sent): see hirate.core.response.
    response = core.response,
}

-- A whole number as text, in every Lua: %d refuses floats in 5.3+, and
-- LuaJIT's tostring writes whole doubles beyond 14 digits in %g form. floor
-- gives an integer in 5.3+ (no ".0") and keeps LuaJIT on its compiled path,
-- which string.format would leave.
local function int(n)
    if n < 1e14 and n > -1e14 then
        return tostring(floor(n))
    end
    return format("%.0f", n)
end

_M.int = int

--- limits(bands, name): the limits that response() takes for a limiter's
--- bands (lim:bands()), name (when not nil) naming a limiter of one band;
--- the core checks the names now, so that a bad one fails where it is given.
function _M.limits(bands, name)
    if name ~= nil and type(name) ~= "string" then
        error("name must be a string, got " .. type(name), 2)
    end
    local out, probe = {}, { allowed = true, remaining = 0, retry_after = 0, reset_after = 0,
        source = "redis", bands = {} }
    for i, b in ipairs(bands) do
        out[i] = { name = (i == 1 and name) or b.name, capacity = b.capacity, rate = b.rate }
        probe.bands[i] = probe
    end
    local ok, err = pcall(core.response, out, probe, 0)
    if not ok then
        -- The core's words, said of the name given.
        error(format("name %q: %s", tostring(name), (err:gsub("^limits%[%d+%]: ", ""))), 2)
    end
    return out
end

return _M
