--[[
hirate.resty.limit: the limit{} middleware of hirate.resty, re-exported
there (hirate.resty.limit{...}, reset, refund, peek, charge,
client_address; see docs/lua.md, "OpenResty"). From access_by_lua*, one
limit on the current request: a limiter's one decision, of one band or of
several (hirate.new{limits = ...}), with RateLimit headers that list every
band, a refusal's status, headers and body; its key read from the client's
address (hirate.client_ip), a header, a variable or a function.
]]

local core = require "hirate.core"
local headers = require "hirate.headers"
local response = headers.response
local client_ip = require "hirate.client_ip"

local ngx = ngx
local ngx_var, ngx_header = ngx.var, ngx.header
local log, ERR = ngx.log, ngx.ERR

local type, pairs, ipairs, setmetatable, getmetatable, tostring, pcall = type, pairs, ipairs,
    setmetatable, getmetatable, tostring, pcall
local format, sub, find, match, lower, gsub = string.format, string.sub, string.find,
    string.match, string.lower, string.gsub
local floor = math.floor

local cost_error = core.cost_error

local _M = {}

-- What hirate.resty gives this file (use): its new, its limiters'
-- metatable, and its argument errors (which point at the caller's line).
local new_limiter, limiter_mt, raise, arg_error, describe

function _M.use(api)
    new_limiter, limiter_mt = api.new, api.limiter_mt
    raise, arg_error, describe = api.raise, api.arg_error, api.describe
end

local LIMIT_OPTIONS = {
    limiter = true, key = true, cost = true, trusted_proxies = true, proxy_hops = true,
    forwarded_header = true, ipv6_subnet = true, status = true, unavailable_status = true,
    headers = true,
    legacy_headers = true, name = true, body = true, ctx = true, methods = true,
    deduct_when = true,
}

local HTTP_METHODS = {
    GET = true, HEAD = true, POST = true, PUT = true, DELETE = true, PATCH = true,
    OPTIONS = true, TRACE = true, CONNECT = true,
}

-- Compiled options, per options table: a limit's table is made once (in
-- init_worker_by_lua*) and used for every request.
local compiled = setmetatable({}, { __mode = "k" })

local function limit_error(msg)
    raise("hirate.resty.limit: " .. msg)
end

local function compile(opts)
    if type(opts) ~= "table" then
        limit_error("the options must be a table, got " .. type(opts))
    end
    for k in pairs(opts) do
        if not LIMIT_OPTIONS[k] then
            limit_error(format("unknown option %q", tostring(k)))
        end
    end
    local lim = opts.limiter
    if type(lim) == "table" and getmetatable(lim) == nil then
        -- The options of one: made here, once per worker (as the options
        -- table is compiled once), e.g. with limits = "10/second; 1000/day".
        local made, l = pcall(new_limiter, lim)
        if not made then
            limit_error("limiter: " .. gsub(tostring(l), "^[^\n]-:%d+: ", "", 1))
        end
        lim = l
    elseif getmetatable(lim) ~= limiter_mt then
        limit_error("limiter must be a limiter from hirate.new or the options of one, got "
            .. type(lim))
    end
    local c = { limiter = lim }

    local key = opts.key
    if key == nil or key == "remote_addr" then
        c.key_kind = "addr"
    elseif type(key) == "function" then
        c.key_kind, c.key_fn = "fn", key
    elseif type(key) == "string" and match(key, "^header:.") then
        c.key_kind = "var"
        c.key_var = "http_" .. gsub(lower(sub(key, 8)), "-", "_")
    elseif type(key) == "string" and match(key, "^var:.") then
        c.key_kind, c.key_var = "var", sub(key, 5)
    else
        limit_error(format("key must be \"remote_addr\", \"header:<name>\", "
            .. "\"var:<nginx variable>\" or a function, got %s",
            type(key) == "string" and format("%q", key) or type(key)))
    end

    local cost = opts.cost
    if cost == nil then
        c.cost = 1
    elseif type(cost) == "function" then
        c.cost_fn = cost
    elseif type(cost) == "number" and not cost_error(cost) then   -- the core's range
        c.cost = cost
    elseif type(cost) == "number" then   -- in the core's words
        limit_error(cost_error(cost) .. " (or a function that returns one)")
    else
        limit_error("cost must be a number or a function that returns one, got " .. describe(cost))
    end

    local ok, ip = pcall(client_ip.compile, opts)
    if not ok then
        limit_error(ip)
    end
    c.ip = ip

    local status = opts.status == nil and 429 or opts.status
    if type(status) ~= "number" or status ~= floor(status) or status < 400 or status > 599 then
        limit_error("status must be an HTTP error status from 400 to 599, got " .. describe(status))
    end
    c.status = status
    -- Refused because Redis is down (on_error = "closed"): the client did
    -- nothing wrong, so 503, as the Python package answers.
    local unavailable = opts.unavailable_status == nil and 503 or opts.unavailable_status
    if type(unavailable) ~= "number" or unavailable ~= floor(unavailable) or unavailable < 400
        or unavailable > 599 then
        limit_error("unavailable_status must be an HTTP error status from 400 to 599, got "
            .. describe(unavailable))
    end
    c.unavailable = unavailable
    c.headers = opts.headers ~= false
    c.legacy = opts.legacy_headers == true
    -- ngx.ctx costs its first user in a request a table and a registry
    -- slot: only when asked for.
    c.ctx = opts.ctx == true
    -- The headers describe the limiter's bands, by the core's names and
    -- windows: one item per band (hirate.headers, the core's formatter).
    local bands = lim:bands()
    if #bands > 1 and opts.name ~= nil then
        limit_error("name: a limiter of several bands names each of them (hirate.new{ "
            .. "limits = { {capacity =, rate =, name =}, ... } })")
    end
    local made, limits = pcall(headers.limits, bands, opts.name)
    if not made then
        limit_error(limits)
    end
    c.limits = limits
    c.flags = (c.headers and headers.RATELIMIT or 0) + (c.legacy and headers.LEGACY or 0)
    c.memo, c.memo_n = {}, 0
    local methods = opts.methods
    if methods ~= nil then
        if type(methods) == "string" then
            methods = { methods }
        end
        if type(methods) ~= "table" or #methods == 0 then
            limit_error("methods must be a method name or a list of them, got "
                .. describe(opts.methods))
        end
        c.methods = {}
        for _, m in ipairs(methods) do
            local up = type(m) == "string" and string.upper(m) or nil
            if not HTTP_METHODS[up] then
                limit_error("methods: " .. describe(m) .. " is not an HTTP method")
            end
            c.methods[up] = true
        end
        -- A GET location answers HEAD: a HEAD must not escape the limit.
        c.methods.HEAD = c.methods.HEAD or c.methods.GET
    end
    if opts.deduct_when ~= nil and type(opts.deduct_when) ~= "function" then
        limit_error("deduct_when must be a function(status), got " .. type(opts.deduct_when))
    end
    c.deduct_when = opts.deduct_when
    local body = opts.body
    if body ~= nil and type(body) ~= "string" and type(body) ~= "function" then
        limit_error("body must be a string or a function, got " .. type(body))
    end
    c.body = body
    compiled[opts] = c
    return c
end

-- The forwarding header's value, when the options make it count.
local function forwarded_value(ip)
    if ip.header == "Forwarded" then
        -- Every Forwarded field, in order (nginx before 1.23 gives a
        -- variable only the first).
        local value = ngx.req.get_headers()["forwarded"]
        if type(value) == "table" then
            value = table.concat(value, ",")
        end
        return value
    end
    return ngx_var.http_x_forwarded_for -- nginx joins repeated fields
end

-- The client's address: the socket peer, or what trusted proxies say.
local function client_address(c)
    local ip = c.ip
    local peer = ngx_var.remote_addr
    if not ip.uses_header then
        return client_ip.resolve(ip, peer, nil)
    end
    return client_ip.resolve(ip, peer, forwarded_value(ip))
end

-- The bucket identity of the client's address, "ip:<address>". nginx
-- writes an IPv4 peer as a plain dotted quad, which is already its
-- identity; anything else is resolved once and remembered (a bounded table
-- per limit, emptied when full), since the same clients come back.
local MEMO_MAX = 4096

local function address_ident(c)
    local ip = c.ip
    local peer = ngx_var.remote_addr or ""
    local value
    if ip.uses_header then
        value = forwarded_value(ip)
    elseif peer ~= "" and not find(peer, ":", 1, true) then
        return core.ident_for_ip(peer)
    end
    local memo_key = value and peer .. "\n" .. value or peer
    local ident = c.memo[memo_key]
    if ident then
        return ident
    end
    ident = core.ident_for_ip(client_ip.key(ip, client_ip.resolve(ip, peer, value)))
    if c.memo_n >= MEMO_MAX then
        c.memo, c.memo_n = {}, 0
    end
    c.memo[memo_key], c.memo_n = ident, c.memo_n + 1
    return ident
end

--- client_address(opts): the client address limit(opts) would key on, with
--- the same proxy options (for logging, say).
function _M.client_address(opts)
    return client_address(compiled[opts] or compile(opts))
end

-- The bucket key of an identity: the core's ("{<identity>}", a Redis
-- Cluster hash tag, so that every limiter's bucket for one client is on one
-- node; a long identity hashed with SHA-256), as in Python.
local bucket_key = core.bucket_key

-- The bucket key of a request, from the core's identities:
-- "ip:<address>" (IPv6 by its network) or "k:<value>", so that no header
-- value can name an address's bucket (bucket_key). nil: the request is
-- exempt.
local function key_of(c)
    local ident
    local kind = c.key_kind
    if kind == "addr" then
        ident = address_ident(c)
    elseif kind == "var" then
        local v = ngx_var[c.key_var]
        if v == nil or v == "" then
            ident = address_ident(c) -- no such header or variable
        else
            ident = core.ident_for_key(v)
        end
    else
        local v = c.key_fn()
        if v == nil then
            return nil
        end
        if type(v) == "number" and v == floor(v) then
            v = headers.int(v)
        elseif type(v) ~= "string" then
            raise("hirate.resty.limit: a key function must return a string, a whole number "
                .. "or nil, got " .. type(v))
        end
        ident = core.ident_for_key(v)
    end
    return bucket_key(ident)
end

-- A client of reset() and peek(): { key = <what the key option reads> } or
-- { address = <the client's address> }.
local function client_key(c, client, fname)
    if type(client) ~= "table" or (client.key == nil) == (client.address == nil) then
        arg_error(fname, 2, "the client must be { key = <value> } or { address = <address> }, "
            .. "one of them")
    end
    if client.key ~= nil then
        local v = client.key
        if type(v) == "number" and v == floor(v) then
            v = headers.int(v)
        elseif type(v) ~= "string" then
            arg_error(fname, 2, "key must be a string or a whole number, got " .. type(v))
        end
        return bucket_key(core.ident_for_key(v))
    end
    return bucket_key(core.ident_for_ip(client_ip.key(c.ip, client.address)))
end

--- reset(opts, client): forgets one client's bucket of a limit{} (it is
--- full again) without naming its key: client is { key = <what the key
--- option reads for it> } or { address = <its address> }. true, or nil,
--- message, code.
function _M.reset(opts, client)
    local c = compiled[opts] or compile(opts)
    return c.limiter:reset(client_key(c, client, "reset"))
end

--- refund(opts, client, tokens): gives tokens (default 1) back to one
--- client's bucket of a limit{} (client as for reset), e.g. after the
--- upstream failed; the decision (the bucket after), or nil, message, code.
function _M.refund(opts, client, tokens)
    local c = compiled[opts] or compile(opts)
    return c.limiter:refund(client_key(c, client, "refund"), tokens or 1)
end

--- peek(opts, client, cost): one client's bucket of a limit{} (client as
--- for reset), spending nothing: the decision for cost (default 0: the
--- bucket as it is), or nil, message, code.
function _M.peek(opts, client, cost)
    local c = compiled[opts] or compile(opts)
    return c.limiter:peek(client_key(c, client, "peek"), cost or 0)
end

--- limit(opts): applies the limit to the current request. Allowed: returns
--- the decision (and sets the headers). Refused: answers `status` (429), or
--- `unavailable_status` (503) when Redis is down under on_error "closed", with
--- the headers, Retry-After and a short text body, and ends the request. A
--- key function that returns nil exempts the request (returns nil). A
--- configuration error (a wrong password...) is logged and answered 500.
--- With ctx = true the decision is also left in ngx.ctx.hirate (for
--- log_by_lua*, say).
function _M.limit(opts)
    local c = compiled[opts] or compile(opts)
    if c.methods and not c.methods[ngx.req.get_method()] then
        return nil
    end
    local key = key_of(c)
    if key == nil then
        return nil
    end
    local cost = c.cost
    if c.cost_fn then
        cost = c.cost_fn()
    end
    local d, err, code
    if c.deduct_when then
        -- Checked now, charged by charge() once the response is known.
        d, err, code = c.limiter:peek(key, cost)
        if d and d.allowed then
            local ctx = ngx.ctx
            local pending = ctx.hirate_charges
            if not pending then
                pending = {}
                ctx.hirate_charges = pending
            end
            pending[#pending + 1] = { c.limiter, key, cost, c.deduct_when }
        end
    else
        d, err, code = c.limiter:allow(key, cost)
    end
    if not d then
        log(ERR, "hirate: ", err, " (", code, ")")
        return ngx.exit(500)
    end
    if c.ctx then
        ngx.ctx.hirate = d
    end
    local status, _, policy, ratelimit, x_limit, x_remaining, x_reset, retry_after, text =
        response(c.limits, d, c.flags)
    if c.headers then
        ngx_header["RateLimit-Policy"] = policy
        ngx_header["RateLimit"] = ratelimit
    end
    if c.legacy then
        ngx_header["X-RateLimit-Limit"] = x_limit
        ngx_header["X-RateLimit-Remaining"] = x_remaining
        ngx_header["X-RateLimit-Reset"] = x_reset
    end
    if d.allowed then
        return d
    end
    -- Retry-After belongs to a refusal, with the RateLimit headers or not.
    ngx_header["Retry-After"] = retry_after
    local body = c.body
    if type(body) == "function" then
        body = body(d)
    elseif body == nil then
        body = text .. "\n"
    end
    ngx.status = status == 503 and c.unavailable or c.status
    ngx_header["Content-Type"] = "text/plain; charset=utf-8"
    ngx.print(body)
    return ngx.exit(ngx.HTTP_OK)
end

local function charge_now(premature, pending)
    if premature then
        return
    end
    for _, p in ipairs(pending) do
        local d, err, code = p[1]:allow(p[2], p[3])
        if not d then
            log(ERR, "hirate: charge: ", err, " (", code, ")")
        end
    end
end

--- charge(): from log_by_lua*, charges the limits with deduct_when of the
--- current request whose deduct_when(status) says so. The log phase has
--- no cosockets, so the charge runs in a timer right after the request:
--- see docs/lua.md for what that means when requests race.
function _M.charge()
    local pending = ngx.ctx.hirate_charges
    if not pending then
        return
    end
    ngx.ctx.hirate_charges = nil
    local status, due = ngx.status, {}
    for _, p in ipairs(pending) do
        if p[4](status) then
            due[#due + 1] = p
        end
    end
    if due[1] then
        local ok, err = ngx.timer.at(0, charge_now, due)
        if not ok then
            log(ERR, "hirate: charge: cannot start a timer: ", err)
        end
    end
end


return _M
