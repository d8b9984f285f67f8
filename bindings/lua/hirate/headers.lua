--[[
hirate.headers: the response headers that describe a decision, as the IETF
httpapi rate-limit headers draft (structured-field lists) defines them,
mapped onto a token bucket. Pure Lua (5.1-5.4, LuaJIT). The values are the
ones the Python package sends (bindings/python/hirate/_http.py):

  RateLimit-Policy: "<name>";q=<capacity>;w=<seconds to refill from empty>
  RateLimit:        "<name>";r=<remaining>;t=<seconds>
  Retry-After:      <seconds>                      (refusals only)

t is the time until the bucket is full when the request was allowed, and the
time until the same request could pass when it was refused. Seconds are
rounded up, so that a client who waits that long is never early. A request
that can never pass (its cost is above the capacity) gets neither t nor
Retry-After: waiting would not help. The default name is
"<capacity>-per-<w>s".

With legacy = true, X-RateLimit-Limit, X-RateLimit-Remaining and
X-RateLimit-Reset (the same t) are added.
]]

local ceil, floor, huge, max = math.ceil, math.floor, math.huge, math.max
local format, find, gsub, type, error, tostring = string.format, string.find, string.gsub, type,
    error, tostring

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

--- w: whole seconds to refill an empty bucket, rounded up. The same double
--- arithmetic as the core's reset_after from 0 tokens (bucket.c,
--- hirate_bucket_until), so that w is what a drained bucket says.
function _M.window(capacity, rate)
    local target = capacity + 0.0
    local function level(r)
        return 0.0 + r * rate / 1000000.0
    end
    local r = ceil(target * 1000000.0 / rate)
    for _ = 1, 64 do
        if level(r) >= target then
            break
        end
        r = r + 1
    end
    for _ = 1, 64 do
        if not (r > 1 and level(r - 1) >= target) then
            break
        end
        r = r - 1
    end
    -- r / 1e6 rounded up, exactly: r is a whole number below 2^53, but the
    -- quotient of a large one may round to a whole number from below.
    local q = floor(r / 1000000)
    while q * 1000000 < r do
        q = q + 1
    end
    while q > 0 and (q - 1) * 1000000 >= r do
        q = q - 1
    end
    return q
end

--- The default policy name: "<capacity>-per-<w>s".
function _M.default_name(capacity, rate)
    return int(capacity) .. "-per-" .. int(_M.window(capacity, rate)) .. "s"
end

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

--- The text of a refusal, as the Python package writes it.
function _M.refusal_text(d)
    local head = d.source == "fail_closed" and "The rate limit cannot be checked now"
        or "Too many requests"
    local t = _M.t(d)
    if not t then
        return head .. "; this request exceeds the limit and can never pass.\n"
    end
    return head .. "; retry in " .. int(t) .. (t == 1 and " second.\n" or " seconds.\n")
end

return _M
