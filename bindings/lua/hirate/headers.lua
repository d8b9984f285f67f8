--[[
hirate.headers: the response headers that describe a decision, as the IETF
httpapi rate-limit headers draft (structured-field lists) defines them,
mapped onto a token bucket. The values are the ones the Python package
sends (bindings/python/hirate/_http.py):

  RateLimit-Policy: "<name>";q=<capacity>;w=<seconds to refill from empty>
  RateLimit:        "<name>";r=<remaining>;t=<seconds>
  Retry-After:      <seconds>                      (refusals only)

A limiter of several bands sends one item per band in each list, in the
limiter's order ("burst";q=10;w=1, "daily";q=1000;w=86400), each with the
band's own figures; Retry-After is the whole decision's.

t is the time until the bucket is full when the request was allowed (for a
band: when the band held the cost), and the time until the same request
could pass when it was refused. Seconds are rounded up, so that a client who
waits that long is never early. A request that can never pass (its cost is
above the capacity) gets neither t nor Retry-After: waiting would not help.
Names and w are the core's (lim:bands(), hirate.refill_seconds): nothing
here restates how a bucket refills.

With legacy = true, X-RateLimit-Limit, X-RateLimit-Remaining and
X-RateLimit-Reset (the same t) are added, for the whole decision.
]]

local ceil, floor, huge, max = math.ceil, math.floor, math.huge, math.max
local ipairs = ipairs
local format, find, gsub, type, error, tostring = string.format, string.find, string.gsub, type,
    error, tostring
local concat = table.concat

local core = require "hirate.core"

local _M = {}

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

--- Seconds rounded up (never below 0). A decision's seconds are us / 1e6,
--- one correctly rounded division, exact whenever us is a whole number of
--- seconds: 2 s stays 2, and 2.000001 s becomes 3.
function _M.ceil_seconds(s)
    return max(0, ceil(s))
end

local ceil_s = _M.ceil_seconds

--- w: whole seconds to refill an empty bucket, rounded up: the core's
--- hirate_refill_seconds, so that w is what a drained bucket says.
_M.window = core.refill_seconds

--- Checks a policy name (a structured-field string holds printable ASCII
--- only) and returns it quoted.
function _M.quote(name)
    if type(name) ~= "string" or name == "" or find(name, "[^\32-\126]") then
        error(format("name must be 1 or more printable ASCII characters (it is sent in the "
            .. "RateLimit headers), got %s",
            type(name) == "string" and format("%q", name) or type(name)), 2)
    end
    return '"' .. gsub(name, '[\\"]', "\\%0") .. '"'
end

--- t for decision d: nil when it can never pass.
function _M.t(d)
    if d.allowed then
        return ceil_s(d.reset_after)
    elseif d.retry_after == huge then
        return nil
    end
    return ceil_s(d.retry_after)
end

--- The RateLimit-Policy value: quoted is quote(name), w is window(capacity,
--- rate). It depends on the limit only, so callers may keep it.
function _M.policy(quoted, capacity, w)
    return quoted .. ";q=" .. int(capacity) .. ";w=" .. int(w)
end

--- The RateLimit value for remaining tokens and t (nil: never).
function _M.item(quoted, remaining, t)
    local r = quoted .. ";r=" .. int(max(0, remaining))
    if t then
        return r .. ";t=" .. int(t)
    end
    return r
end

--- The headers for decision d under a policy: quoted is quote(name), w is
--- window(capacity, rate). Writes them into out (a table of name -> value,
--- the others set to nil) and returns it.
function _M.build(d, quoted, capacity, w, legacy, out)
    out = out or {}
    local t = _M.t(d)
    out["RateLimit-Policy"] = _M.policy(quoted, capacity, w)
    out["RateLimit"] = _M.item(quoted, d.remaining, t)
    out["Retry-After"] = (not d.allowed and t) and int(t) or nil
    if legacy then
        out["X-RateLimit-Limit"] = int(capacity)
        out["X-RateLimit-Remaining"] = int(max(0, d.remaining))
        out["X-RateLimit-Reset"] = t and int(t) or nil
    end
    return out
end

--- The RateLimit-Policy value of several bands: quoted[i] is band i's
--- quote(name), bands[i] its {capacity =}, ws[i] its window.
function _M.policies(quoted, bands, ws)
    local out = {}
    for i = 1, #quoted do
        out[i] = _M.policy(quoted[i], bands[i].capacity, ws[i])
    end
    return concat(out, ", ")
end

--- The RateLimit value of decision d of a limiter of several bands: one
--- item per band, from d.bands (each band's own remaining and t).
function _M.items(d, quoted)
    local out, bands = {}, d.bands
    for i = 1, #quoted do
        local b = bands[i]
        out[i] = _M.item(quoted[i], b.remaining, _M.t(b))
    end
    return concat(out, ", ")
end

--- The names of the bands that refused decision d (of several bands), in
--- the limiter's order.
function _M.refused(d)
    local out = {}
    for _, b in ipairs(d.bands) do
        if not b.allowed then
            out[#out + 1] = b.name
        end
    end
    return out
end

--- The text of a refusal, as the Python package writes it. With several
--- bands, a refusal by the limits (not by an outage) names the bands that
--- refused: "Too many requests (burst, daily); retry in 2 seconds."
function _M.refusal_text(d)
    local head = d.source == "fail_closed" and "The rate limit cannot be checked now"
        or "Too many requests"
    if d.bands and d.source ~= "fail_closed" then
        local names = _M.refused(d)
        if names[1] then
            head = head .. " (" .. concat(names, ", ") .. ")"
        end
    end
    local t = _M.t(d)
    if not t then
        return head .. "; this request exceeds the limit and can never pass.\n"
    end
    return head .. "; retry in " .. int(t) .. (t == 1 and " second.\n" or " seconds.\n")
end

return _M
