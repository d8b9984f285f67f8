--[[
The handlers of the OpenResty cluster tests (tests/lua/nginx/test_cluster.py):
hirate.resty over a Redis Cluster, through content_by_lua. The limiters are
made when a worker first needs them, one per URL, prefix and capacity (the
test runs two clusters, one of which loses a master). Responses are small
JSON documents.
]]

local hirate = require "hirate"
local json = require "dkjson"

local M = {}

local limiters = {}

local function limiter()
    local args = ngx.req.get_uri_args()
    local url, prefix = args.url, args.prefix
    local capacity = tonumber(args.capacity) or 3
    local id = url .. "\n" .. prefix .. "\n" .. capacity .. "\n" .. (args.server_name or "")
        .. "\n" .. (args.limits or "")
    local lim = limiters[id]
    if not lim then
        -- limits= (a limit string): several bands instead of capacity.
        lim = hirate.new { url = url, prefix = prefix, limits = args.limits,
            capacity = not args.limits and capacity or nil, rate = not args.limits and 0.001 or nil,
            deny_cache = false, timeout = tonumber(args.timeout) or 1, connect_timeout = 0.5,
            tls_server_name = args.server_name }
        limiters[id] = lim
    end
    return lim, args
end

local function outcome(d, err, code)
    if not d then
        return { error = code, message = err }
    end
    local out = { allowed = d.allowed, remaining = d.remaining, source = d.source,
        error = d.error, message = d.message, band = d.band }
    if d.bands then
        out.bands = {}
        for i, b in ipairs(d.bands) do
            out.bands[i] = { allowed = b.allowed, remaining = b.remaining }
        end
    end
    return out
end

local function say(v)
    ngx.header["Content-Type"] = "application/json"
    ngx.say(json.encode(v))
end

-- /allow?url=&prefix=&key=&times=N: N allows of one key, in order.
function M.allow()
    local lim, args = limiter()
    local out = {}
    for i = 1, tonumber(args.times) or 1 do
        out[i] = outcome(lim:allow(args.key))
    end
    say(out)
end

-- /many?url=&prefix=&items=k1:c1,k2:c2,...: one allow_many.
function M.many()
    local lim, args = limiter()
    local items = {}
    for key, cost in args.items:gmatch("([^,:]+):(%d+)") do
        items[#items + 1] = { key, tonumber(cost) }
    end
    local ds, err, code = lim:allow_many(items)
    if not ds then
        return say({ error = code, message = err })
    end
    local out = {}
    for i, d in ipairs(ds) do
        out[i] = outcome(d)
    end
    say(out)
end

-- /stats?url=&prefix=: the limiter's counters.
function M.stats()
    say(limiter():_stats())
end

return M
