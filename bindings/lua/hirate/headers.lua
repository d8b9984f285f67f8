--[[
hirate.headers: the response headers that describe a decision, as the
IETF httpapi rate-limit headers draft (structured-field lists) defines them,
mapped onto a token bucket. Pure Lua (5.1-5.4, LuaJIT); the Python package
writes the same values.

  RateLimit-Policy: "<name>";q=<capacity>;w=<seconds to refill from empty>
  RateLimit:        "<name>";r=<remaining>;t=<seconds>
  Retry-After:      <seconds>                      (refusals only)

t is the time until the bucket is full when the request was allowed, and the
time until the same request could pass when it was refused. Every number of
seconds is rounded up, so that a client who waits that long is never early.
A request that can never pass (cost above the capacity) gets no Retry-After,
and t is the time until the bucket is full: waiting will not help.

With legacy = true, X-RateLimit-Limit, X-RateLimit-Remaining and
X-RateLimit-Reset (the same t, in seconds from now) are added.
]]

local ceil, huge = math.ceil, math.huge
local format, find, gsub, type, error = string.format, string.find, string.gsub, type, error

local _M = {}

-- A whole number as text, in every Lua: %d refuses floats in 5.3+, and
-- LuaJIT prints large whole doubles in %g form through tostring.
local function int(n)
    return format("%.0f", n)
end

-- Seconds rounded up. A decision's seconds are us / 1e6, one correctly
-- rounded division, which is exact whenever us is a whole number of
-- seconds: 2 s stays 2, and 2.000001 s becomes 3.
local ceil_s = ceil
_M.ceil_seconds = ceil_s

--- Checks a policy name: a structured-field string holds printable ASCII
--- only. Returns the quoted form.
function _M.quote(name)
    if type(name) ~= "string" or name == "" or find(name, "[^\32-\126]") then
        error(format("the policy name must be printable ASCII text, got %s",
            type(name) == "string" and format("%q", name) or type(name)), 2)
    end
    return '"' .. gsub(name, '[\\"]', "\\%0") .. '"'
end

--- The window w: seconds to refill an empty bucket, rounded up.
function _M.window(capacity, rate)
    return ceil(capacity / rate)
end

--- The headers for decision d of a limiter with this capacity and rate.
--- quoted is quote(name). Returns a table of name -> value.
function _M.build(d, quoted, capacity, rate, legacy, out)
    out = out or {}
    local t
    if d.allowed then
        t = ceil_s(d.reset_after)
    elseif d.retry_after == huge then
        t = ceil_s(d.reset_after)
    else
        t = ceil_s(d.retry_after)
        out["Retry-After"] = int(t)
    end
    out["RateLimit-Policy"] = quoted .. ";q=" .. int(capacity) .. ";w=" .. int(_M.window(capacity, rate))
    out["RateLimit"] = quoted .. ";r=" .. int(d.remaining) .. ";t=" .. int(t)
    if legacy then
        out["X-RateLimit-Limit"] = int(capacity)
        out["X-RateLimit-Remaining"] = int(d.remaining)
        out["X-RateLimit-Reset"] = int(t)
    end
    return out
end

return _M
