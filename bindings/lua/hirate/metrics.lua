--[[
hirate.metrics: a limiter's metrics (lim:stats()) in the Prometheus text
format, summed over nginx's workers.

Each worker has limiters of its own, and each limiter counts only what its
worker did. To serve the whole from one location, every worker copies its
limiter's figures into a lua_shared_dict under the limiter's name and its
worker id (publish), and the location that answers sums every worker's copy
of each name (prometheus):

    lua_shared_dict hirate_metrics 1m;
    header_filter_by_lua_block {
        require("hirate.metrics").publish(ngx.shared.hirate_metrics, "api", lim)
    }
    location = /metrics {
        content_by_lua_block {
            ngx.header["Content-Type"] = "text/plain; version=0.0.4"
            ngx.print(require("hirate.metrics").prometheus(ngx.shared.hirate_metrics))
        }
    }

The one label of a limiter is its name (given to publish), besides the
decision's source, the error's code and the latency bucket's bound: never a
key, so the number of series is bounded by the number of limiters. Outside
nginx, render() and sum() work on lim:stats() tables directly.
]]

local type, pairs, ipairs, tonumber, tostring, error = type, pairs, ipairs, tonumber, tostring,
    error
local concat, sort = table.concat, table.sort
local format, gsub, gmatch, find = string.format, string.gsub, string.gmatch, string.find

local _M = {}

-- A number as Prometheus reads it: whole numbers in full, others in the
-- shortest form that reads back as the same double.
local function num(v)
    if v == math.huge then
        return "+Inf"
    elseif v == math.floor(v) and v > -2 ^ 53 and v < 2 ^ 53 then
        return format("%.0f", v)
    end
    for prec = 1, 17 do
        local s = format("%." .. prec .. "g", v)
        if tonumber(s) == v then
            return s
        end
    end
    return tostring(v)
end

-- The figures of a lim:stats() table as lines "<field> <value>": the
-- copy a worker leaves in the shared dict. Nested fields are
-- "decisions.<source>", "errors.<code>", "bound.<i>", "count.<i>".
local function encode(s)
    local out, n = {}, 0
    local function put(k, v)
        n = n + 1
        out[n] = k .. " " .. num(v)
    end
    for k, v in pairs(s) do
        if k == "decisions" or k == "errors" then
            for name, c in pairs(v) do
                put(k .. "." .. name, c)
            end
        elseif k == "latency" then
            for i, b in ipairs(v.bounds) do
                put("bound." .. i, b)
            end
            for i, c in ipairs(v.counts) do
                put("count." .. i, c)
            end
        else
            put(k, v)
        end
    end
    return concat(out, "\n")
end

-- The table encode() was given, back from its text.
local function decode(text)
    local s = { decisions = {}, errors = {}, latency = { bounds = {}, counts = {} } }
    for k, v in gmatch(text, "([^ \n]+) ([^\n]+)") do
        local group, name = k:match("^(%a+)%.(.+)$")
        local value = tonumber(v)
        if group == "bound" then
            s.latency.bounds[tonumber(name)] = value
        elseif group == "count" then
            s.latency.counts[tonumber(name)] = value
        elseif group then
            s[group][name] = value
        else
            s[k] = value
        end
    end
    return s
end

--- sum(a, b): a lim:stats() table of both together (a new table); a may be
--- nil. The bounds are b's (every limiter has the core's).
function _M.sum(a, b)
    if a == nil then
        a = { decisions = {}, errors = {}, latency = { bounds = {}, counts = {} } }
    end
    local out = { decisions = {}, errors = {},
        latency = { bounds = b.latency.bounds, counts = {} } }
    for k, v in pairs(b) do
        if k == "decisions" or k == "errors" then
            for name, c in pairs(a[k]) do
                out[k][name] = c
            end
            for name, c in pairs(v) do
                out[k][name] = (out[k][name] or 0) + c
            end
        elseif k == "latency" then
            for i, c in ipairs(v.counts) do
                out.latency.counts[i] = (a.latency.counts[i] or 0) + c
            end
        else
            out[k] = (a[k] or 0) + v
        end
    end
    return out
end

-- A label value in the text format: \, " and newlines escaped.
local function label(v)
    return (gsub(v, '[\\"\n]', { ["\\"] = "\\\\", ['"'] = '\\"', ["\n"] = "\\n" }))
end

local function sorted_keys(t)
    local keys = {}
    for k in pairs(t) do
        keys[#keys + 1] = k
    end
    sort(keys)
    return keys
end

-- The counters: the metric's name, its help, and the stats field it shows
-- (with a second label for the by-source and by-code tables).
local COUNTERS = {
    { "hirate_decisions_total", "Decisions of calls that spend, by who decided.", "decisions",
        "source" },
    { "hirate_refused_total", "Of those decisions, the refusals.", "refused" },
    { "hirate_peeks_total", "Decisions of peeks.", "peeks" },
    { "hirate_errors_total", "Failures met, by code: those returned and the outages a "
        .. "policy answered for.", "errors", "code" },
    { "hirate_breaker_opens_total", "Times a Redis node's breaker opened (an outage began).",
        "breaker_opens" },
    { "hirate_breaker_closes_total", "Times it closed again (Redis answered).", "breaker_closes" },
    { "hirate_connections_total", "Redis connections made.", "connects" },
    { "hirate_connections_dropped_total", "Redis connections closed after an error.",
        "conns_dropped" },
}

--- render(by_name): the Prometheus text of { [limiter name] = lim:stats()
--- table }, every limiter's series under its name.
function _M.render(by_name)
    local names = sorted_keys(by_name)
    local out, n = {}, 0
    local function line(s)
        n = n + 1
        out[n] = s
    end
    for _, c in ipairs(COUNTERS) do
        local metric, help, field, sub = c[1], c[2], c[3], c[4]
        line("# HELP " .. metric .. " " .. help)
        line("# TYPE " .. metric .. " counter")
        for _, name in ipairs(names) do
            local v = by_name[name][field]
            local lim = 'limiter="' .. label(name) .. '"'
            if sub then
                for _, k in ipairs(sorted_keys(v)) do
                    line(format('%s{%s,%s="%s"} %s', metric, lim, sub, label(k), num(v[k])))
                end
            else
                line(format("%s{%s} %s", metric, lim, num(v)))
            end
        end
    end
    local metric = "hirate_redis_round_trip_seconds"
    line("# HELP " .. metric .. " Redis round trips by how long they took.")
    line("# TYPE " .. metric .. " histogram")
    for _, name in ipairs(names) do
        local s = by_name[name]
        local lim = 'limiter="' .. label(name) .. '"'
        -- The core's counts are each bucket's own; Prometheus' are cumulative.
        local below = 0
        for i, c in ipairs(s.latency.counts) do
            below = below + c
            local le = s.latency.bounds[i] or math.huge
            line(format('%s_bucket{%s,le="%s"} %s', metric, lim, num(le), num(below)))
        end
        line(format("%s_sum{%s} %s", metric, lim, num(s.latency_sum)))
        line(format("%s_count{%s} %s", metric, lim, num(s.latency_count)))
    end
    return concat(out, "\n") .. "\n"
end

--- publish(dict, name, lim): copies lim:stats() into the lua_shared_dict
--- dict under name and this worker's id, replacing this worker's last
--- copy. Cheap enough for every request (header_filter_by_lua*), or run it
--- on a timer (ngx.timer.every) to publish less often. true, or nil and the
--- error (a closed limiter, a full dict).
function _M.publish(dict, name, lim)
    if type(name) ~= "string" or name == "" or find(name, "\n", 1, true) then
        error("hirate.metrics.publish: name must be a non-empty string of one line", 2)
    end
    local s, err = lim:stats()
    if not s then
        return nil, err
    end
    local ok
    ok, err = dict:set(name .. "\n" .. ngx.worker.id(), encode(s))
    if not ok then
        return nil, err
    end
    return true
end

--- collect(dict): { [name] = the sum of every worker's copy } (see publish).
function _M.collect(dict)
    local by_name = {}
    for _, k in ipairs(dict:get_keys(0)) do
        local name = k:match("^(.*)\n%d+$")
        local text = name and dict:get(k)
        if text then
            by_name[name] = _M.sum(by_name[name], decode(text))
        end
    end
    return by_name
end

--- prometheus(dict): the text format of every limiter published in dict,
--- summed over the workers.
function _M.prometheus(dict)
    return _M.render(_M.collect(dict))
end

-- For the specs: the copy a worker leaves, and back.
_M._encode, _M._decode = encode, decode

return _M
