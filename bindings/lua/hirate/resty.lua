--[[
hirate.resty: hirate inside OpenResty (nginx with lua-nginx-module).

`require "hirate"` returns this module's limiter when `ngx` exists. It is the
C limiter of `hirate.core` for everything but I/O: validation, the deny cache,
the circuit breaker and the failure policy are the core's own, and the core
encodes the script call and decodes the reply (the sans-IO "op" hooks). The
bytes travel through nginx cosockets, so a slow or stopped Redis never blocks
the worker: a round trip is bounded by the limiter's timeouts and other
requests go on meanwhile.

  * Connections come from a keepalive pool per worker, named after the
    endpoint and the AUTH/SELECT a new connection needs (so limiters with
    another user or database never share one); `pool_size` (default 16) idle
    connections are kept for `keepalive_timeout` seconds (default 60);
    `backlog`, when set, also caps open connections at `pool_size` and queues
    at most `backlog` waiting requests (lua-nginx-module's rule).
  * A new connection first sends the handshake (AUTH, SELECT) and needs +OK
    for each; a refused AUTH is HIRATE_EAUTH, returned as an error. After a
    refusal, new connections wait out a backoff (10 ms doubling to 1 s), as
    in the C client, so a wrong password cannot become a connection storm.
  * A timeout or a broken connection hands the call to the failure policy
    (op:fail) and the connection is closed; so is one the core marks for
    dropping, or one with bytes nobody asked for.
  * While the breaker is open the core needs no Redis: no I/O at all.

Cosockets exist only in the rewrite, access, content and timer phases (and
the ssl_* certificate/session phases). A Redis-backed limiter called anywhere
else (init, init_worker, set, header_filter, body_filter, log, balancer)
raises an error naming the phase, rather than blocking the worker or quietly
answering from a per-worker bucket: run it from access_by_lua*, or defer it
with ngx.timer.at(0, ...). A limiter without a URL (in memory) does no I/O
and works in every phase.

limit{...} applies a limit to the current request from access_by_lua* (see
docs/lua.md, "OpenResty").
]]

local core = require "hirate.core"
local headers = require "hirate.headers"
local client_ip = require "hirate.client_ip"

local ngx = ngx
local tcp = ngx.socket.tcp
local get_phase = ngx.get_phase
local ngx_now, update_time = ngx.now, ngx.update_time
local ngx_var, ngx_header = ngx.var, ngx.header
local log, ERR, WARN = ngx.log, ngx.ERR, ngx.WARN

local type, pairs, setmetatable, getmetatable, error, tostring, tonumber, pcall = type, pairs,
    setmetatable, getmetatable, error, tostring, tonumber, pcall
local format, sub, find, match, lower, gsub = string.format, string.sub, string.find,
    string.match, string.lower, string.gsub
local floor, ceil, max, min = math.floor, math.ceil, math.max, math.min

local _M = { _VERSION = core.version() }

local KEY_MAX = 512
local EXACT_MAX = 9007199254740991
local RECV_MAX = 65536

-- The phases in which lua-nginx-module offers cosockets.
local COSOCKET_PHASES = {
    rewrite = true, server_rewrite = true, access = true, content = true, timer = true,
    ssl_cert = true, ssl_session_fetch = true, ssl_client_hello = true, preread = true,
}

-- Options this module takes; the rest go to the C limiter, which names any
-- it does not know.
local OWN_OPTIONS = { keepalive_timeout = true, backlog = true }

local Limiter = {}
local limiter_mt = { __index = Limiter }

function limiter_mt.__tostring(self)
    return tostring(self.lim)
end

---------------------------------------------------------------------------
-- Arguments: checked here so that messages name the method the caller
-- used, with the core's wording.

-- Errors point at the caller's line, as the C module's do in plain Lua:
-- at the first stack level outside this file (none when that is a C
-- function, pcall say).
local THIS = debug.getinfo(1, "S").source

local function raise(msg)
    local level = 2
    while true do
        local info = debug.getinfo(level, "S")
        if not info or info.source ~= THIS then
            break
        end
        level = level + 1
    end
    error(msg, level)
end

local function arg_error(fname, n, msg)
    raise(format("bad argument #%d to '%s' (%s)", n, fname, msg))
end

-- A number as the C module shows it in messages: whole numbers in full,
-- others in the shortest form that reads back as the same double.
local function describe(v)
    if type(v) ~= "number" then
        return type(v)
    end
    if v == floor(v) and v > -2 ^ 63 and v < 2 ^ 63 then
        return format("%.0f", v)
    end
    for prec = 15, 17 do
        local s = format("%." .. prec .. "g", v)
        if tonumber(s) == v then
            return s
        end
    end
    return tostring(v)
end

-- what is "key" or "item 2: key", as in the C module's messages.
local function check_key(key, fname, n, what)
    what = what or "key"
    if type(key) ~= "string" then
        arg_error(fname, n, what .. " must be a string, got " .. type(key))
    end
    local len = #key
    if len == 0 then
        arg_error(fname, n, what .. " is empty")
    elseif len > KEY_MAX then
        arg_error(fname, n, format("%s is %d bytes; the most is %d", what, len, KEY_MAX))
    end
end

local function check_cost(cost, fname, n, what)
    if cost == nil then
        return 1
    end
    what = what or "cost"
    if type(cost) ~= "number" or cost ~= floor(cost) then
        arg_error(fname, n, what .. " must be an integer, got " .. describe(cost))
    end
    if cost < 0 or cost > EXACT_MAX then
        arg_error(fname, n, what .. " must be a whole number from 0 to 2^53-1, got "
            .. describe(cost))
    end
    return cost
end

local function check_phase(fname)
    local phase = get_phase()
    if not COSOCKET_PHASES[phase] then
        raise(format("hirate: %s cannot reach Redis in the '%s' phase, where nginx has no "
            .. "cosockets; call it from rewrite, access or content (or a timer: ngx.timer.at)",
            fname, phase))
    end
end

---------------------------------------------------------------------------
-- Talking to Redis through a cosocket.

-- What an error reply means, as the core's proto.c classifies it.
local UNAVAILABLE = {
    OOM = true, BUSY = true, READONLY = true, LOADING = true, MASTERDOWN = true,
    CLUSTERDOWN = true, TRYAGAIN = true, MISCONF = true, NOREPLICAS = true,
}

local function error_class(line)
    local word = match(line, "^%-(%S+)")
    if UNAVAILABLE[word] then
        return "ESERVER"
    elseif word == "WRONGPASS" or word == "NOAUTH" then
        return "EAUTH"
    elseif word == "NOPERM" then
        return "ENOPERM"
    end
    return "EREPLY"
end

-- The core's name for a cosocket error.
local function io_code(err)
    return err == "timeout" and "ETIMEDOUT" or "EIO"
end

local function io_failed(self, what, err)
    log(WARN, "hirate: Redis at ", self.where, ": ", what, ": ", err)
end

-- AUTH and SELECT on a new connection. Returns nil, or the error name.
local function handshake(self, sock)
    local ok, err = sock:send(self.handshake)
    if not ok then
        io_failed(self, "handshake", err)
        return io_code(err)
    end
    for i = 1, self.handshake_n do
        local line
        line, err = sock:receive()
        if not line then
            io_failed(self, "handshake", err)
            return io_code(err)
        end
        if line ~= "+OK" then
            local first = sub(line, 1, 1)
            local code = first ~= "-" and "EPROTO"
                or (i == 1 and self.has_auth) and "EAUTH" or error_class(line)
            -- The server's words, which never hold the password.
            log(ERR, "hirate: Redis at ", self.where, " refused the ",
                (i == 1 and self.has_auth) and "AUTH" or "SELECT", ": ", sub(line, 2, 200))
            return code
        end
    end
    return nil
end

-- Config errors in the handshake make new connections wait, doubling.
local function refused(self, code)
    local wait = self.refused_wait
    wait = wait and min(wait * 2, 1) or 0.01
    self.refused_wait = wait
    update_time()
    self.refused_until = ngx_now() + wait * (0.75 + 0.5 * math.random())
    self.refused_code = code
end

-- Runs op to the end: sends its request(s), feeds it the replies.
local function converse(self, op)
    local req = op:request()
    if not req then
        return -- decided without Redis (bad items, the deny cache, an open breaker)
    end
    if self.refused_until then
        update_time()
        if ngx_now() < self.refused_until then
            return op:fail(self.refused_code)
        end
    end
    local sock = tcp()
    sock:settimeouts(self.connect_ms, self.timeout_ms, self.timeout_ms)
    local ok, err = sock:connect(self.host, self.port, self.pool_opts)
    if not ok then
        io_failed(self, "connect", err)
        return op:fail("ECONNECT")
    end
    if self.handshake and sock:getreusedtimes() == 0 then
        local code = handshake(self, sock)
        if code then
            sock:close()
            if code == "EAUTH" or code == "ENOPERM" or code == "EREPLY" then
                refused(self, code)
            end
            return op:fail(code)
        end
        self.refused_wait, self.refused_until = nil, nil
    end
    ok, err = sock:send(req)
    if not ok then
        sock:close()
        io_failed(self, "send", err)
        return op:fail(io_code(err))
    end
    -- Each request has `timeout` for its whole reply: a reply that trickles
    -- in cannot stretch it read by read.
    local sent_at, shrunk = ngx_now(), false
    local buf = ""
    while true do
        local data
        data, err = sock:receiveany(RECV_MAX)
        if not data then
            sock:close()
            io_failed(self, "receive", err)
            return op:fail(io_code(err))
        end
        if buf ~= "" then
            data = buf .. data
        end
        local state, used = op:feed(data)
        buf = used < #data and sub(data, used + 1) or ""
        if state == "done" then
            break
        elseif state == "send" then -- NOSCRIPT: the same calls again, the first as EVAL
            ok, err = sock:send(op:request())
            if not ok then
                sock:close()
                io_failed(self, "send", err)
                return op:fail(io_code(err))
            end
            sent_at = ngx_now()
            if shrunk then
                sock:settimeouts(self.connect_ms, self.timeout_ms, self.timeout_ms)
                shrunk = false
            end
        else
            update_time()
            local left = self.timeout - (ngx_now() - sent_at)
            if left <= 0 then
                sock:close()
                io_failed(self, "receive", "timeout")
                return op:fail("ETIMEDOUT")
            end
            sock:settimeouts(self.connect_ms, self.timeout_ms, max(1, ceil(left * 1000)))
            shrunk = true
        end
    end
    -- A connection is reused only in a known state: nothing left unread,
    -- nothing the core distrusts.
    if buf ~= "" or op:drop() then
        sock:close()
    else
        ok = sock:setkeepalive(self.keepalive_ms, self.pool_size)
        if not ok then
            sock:close()
        end
    end
end

-- One round: op from items, I/O, decisions.
local function run(self, items, spend, now_us)
    local op, msg, code = self.lim:_op_start(items, spend, now_us)
    if not op then
        return nil, msg, code -- a closed limiter
    end
    local ok, err = pcall(converse, self, op)
    if not ok then
        -- A Lua error mid-I/O (out of memory, say): the outcome is unknown.
        op:fail("EIO")
        op:free()
        error(err, 0)
    end
    local ds
    ds, msg, code = op:results()
    op:free()
    return ds, msg, code
end

local function decide(self, key, cost, spend, now_us, fname)
    check_key(key, fname, 1)
    cost = check_cost(cost, fname, 2)
    if self.closed then
        return nil, "limiter is closed", "ECLOSED"
    end
    check_phase(fname)
    local items = self.items
    local item = items[1]
    item[1], item[2] = key, cost
    local ds, msg, code = run(self, items, spend, now_us)
    item[1] = nil
    if not ds then
        return nil, msg, code
    end
    return ds[1]
end

---------------------------------------------------------------------------
-- The limiter.

local function check_seconds(opts, name, default, lo, hi)
    local v = opts[name]
    if v == nil then
        return default
    end
    if type(v) ~= "number" or v ~= v or v < lo or v > hi then
        arg_error("new", 1, format("%s must be a number of seconds from %g to %g, got %s",
            name, lo, hi, describe(v)))
    end
    return v
end

-- core.new from a Lua frame, so that its argument errors name 'new' (under
-- pcall directly they would say '?'); not a tail call, which would lose it.
local function make_core(opts)
    local lim = core.new(opts)
    return lim
end

--- hirate.new{...} inside OpenResty. The options are those of the C limiter
--- plus keepalive_timeout (seconds an idle pooled connection is kept, default
--- 60; 0 keeps it for ever) and backlog (see above).
function _M.new(opts)
    if type(opts) ~= "table" then
        arg_error("new", 1, "table expected, got " .. type(opts))
    end
    local keepalive = check_seconds(opts, "keepalive_timeout", 60, 0, 86400)
    local backlog = opts.backlog
    if backlog ~= nil and (type(backlog) ~= "number" or backlog ~= floor(backlog)
            or backlog < 1 or backlog > 65535) then
        arg_error("new", 1, "backlog must be a whole number from 1 to 65535, got "
            .. describe(backlog))
    end
    local copy = {}
    for k, v in pairs(opts) do
        if not OWN_OPTIONS[k] then
            copy[k] = v
        end
    end
    local made, lim = pcall(make_core, copy)
    if not made then
        -- The core's message, at the caller's line rather than this one's.
        raise((gsub(tostring(lim), "^[^\n]-:%d+: ", "", 1)))
    end
    local self = setmetatable({
        lim = lim,
        capacity = opts.capacity,
        rate = opts.rate,
        prefix = opts.prefix or "rl:",
        items = { {} },
    }, limiter_mt)
    local ok, ep = pcall(lim._endpoint, lim)
    if not ok or type(ep) ~= "table" then
        self.memory = true -- no URL: the C limiter decides alone, without I/O
        return self
    end
    local hs, n = lim:_handshake()
    self.connect_ms = max(1, floor(ep.connect_timeout * 1000 + 0.5))
    self.timeout_ms = max(1, floor(ep.timeout * 1000 + 0.5))
    self.timeout = ep.timeout
    if ep.path and ep.path ~= "" then
        self.host, self.port = "unix:" .. ep.path, nil
        self.where = ep.path
    else
        self.host, self.port = ep.host, ep.port
        self.where = (match(ep.host, ":") and "[" .. ep.host .. "]" or ep.host) .. ":" .. ep.port
    end
    if hs ~= "" then
        self.handshake, self.handshake_n = hs, n
        -- AUTH [user] password comes first when the URL has a password.
        local head = sub(hs, 1, 14)
        self.has_auth = head == "*2\r\n$4\r\nAUTH\r\n" or head == "*3\r\n$4\r\nAUTH\r\n"
    end
    self.pool_size = opts.pool_size or 16
    self.keepalive_ms = floor(keepalive * 1000 + 0.5)
    -- One pool per endpoint and credentials: the digest keeps connections
    -- made for one user or database from serving another, without putting
    -- the password into the pool's name.
    self.pool_opts = {
        pool = "hirate:" .. self.where .. (hs ~= "" and ":" .. ngx.md5(hs) or ""),
        pool_size = self.pool_size,
        backlog = backlog,
    }
    return self
end

--- allow(key, cost): spends cost tokens (default 1) if key's bucket holds
--- them. Returns a decision table, or nil, message, code.
function Limiter:allow(key, cost)
    if self.memory then
        return self.lim:allow(key, cost)
    end
    return decide(self, key, cost, true, nil, "allow")
end

--- peek(key, cost): what allow would decide now; spends nothing.
function Limiter:peek(key, cost)
    if self.memory then
        return self.lim:peek(key, cost)
    end
    return decide(self, key, cost, false, nil, "peek")
end

--- allow_many{ {key, cost}, ... }: every item in one pipelined round trip.
function Limiter:allow_many(items)
    if self.memory then
        return self.lim:allow_many(items)
    end
    if type(items) ~= "table" then
        arg_error("allow_many", 1, "table expected, got " .. type(items))
    end
    for i = 1, #items do
        local it = items[i]
        if type(it) ~= "table" then
            arg_error("allow_many", 1, format("item %d must be a table {key, cost}, got %s", i,
                type(it)))
        end
        check_key(it[1], "allow_many", 1, "item " .. i .. ": key")
        check_cost(it[2], "allow_many", 1, "item " .. i .. ": cost")
    end
    if self.closed then
        return nil, "limiter is closed", "ECLOSED"
    end
    check_phase("allow_many")
    if #items == 0 then
        return {}
    end
    return run(self, items, true, nil)
end

--- reset(key): the bucket is full again. true, or nil, message, code.
function Limiter:reset(key)
    if self.memory then
        return self.lim:reset(key)
    end
    check_key(key, "reset", 1)
    if self.closed then
        return nil, "limiter is closed", "ECLOSED"
    end
    check_phase("reset")
    return self:_reset_io(key)
end

--- _decide_at(key, cost, spend, now_us): a decision at an injected time,
--- through the same cosocket path (the test vectors).
function Limiter:_decide_at(key, cost, spend, now_us)
    if self.memory then
        return self.lim:_decide_at(key, cost, spend, now_us)
    end
    return decide(self, key, cost, spend, now_us, "_decide_at")
end

function Limiter:_stats()
    return self.lim:_stats()
end

function Limiter:_endpoint()
    return self.lim:_endpoint()
end

--- close(): frees the C limiter; idempotent. Pooled connections stay in the
--- worker's pool, where limiters with the same endpoint reuse them.
function Limiter:close()
    if not self.closed then
        self.closed = true
        self.lim:close()
    end
end

---------------------------------------------------------------------------
-- reset over a cosocket: the core forgets what it remembers about the key
-- (deny cache, local buckets), then DEL <prefix><key>, as hirate_reset()
-- does with its own client.

local function resp_command(args)
    local out = { "*", #args, "\r\n" }
    for i = 1, #args do
        local a = args[i]
        out[#out + 1] = "$" .. #a .. "\r\n" .. a .. "\r\n"
    end
    return table.concat(out)
end

function Limiter:_reset_io(key)
    local done, msg, code = self.lim:_reset_local(key)
    if not done then
        return nil, msg, code
    end
    local req = resp_command({ "DEL", self.prefix .. key })
    local fail
    local sock = tcp()
    sock:settimeouts(self.connect_ms, self.timeout_ms, self.timeout_ms)
    local ok, err = sock:connect(self.host, self.port, self.pool_opts)
    if not ok then
        return nil, "connect to " .. self.where .. ": " .. tostring(err), "ECONNECT"
    end
    if self.handshake and sock:getreusedtimes() == 0 then
        fail = handshake(self, sock)
        if fail then
            sock:close()
            return nil, "Redis at " .. self.where .. " refused the handshake", fail
        end
    end
    ok, err = sock:send(req)
    local line
    if ok then
        line, err = sock:receive()
    end
    if not line then
        sock:close()
        return nil, "DEL at " .. self.where .. ": " .. tostring(err), io_code(err)
    end
    if match(line, "^:%d+$") then
        if not sock:setkeepalive(self.keepalive_ms, self.pool_size) then
            sock:close()
        end
        return true
    end
    sock:close()
    if sub(line, 1, 1) == "-" then
        return nil, "Redis refused DEL: " .. sub(line, 2, 200), error_class(line)
    end
    return nil, "malformed reply from Redis: DEL gave no integer", "EPROTO"
end

---------------------------------------------------------------------------
-- limit{...}: one limit on the current request, from access_by_lua*.

local LIMIT_OPTIONS = {
    limiter = true, key = true, cost = true, trusted_proxies = true, proxy_hops = true,
    forwarded_header = true, ipv6_subnet = true, status = true, unavailable_status = true,
    headers = true,
    legacy_headers = true, name = true, body = true, ctx = true,
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
    if getmetatable(lim) ~= limiter_mt then
        limit_error("limiter must be a limiter from hirate.new, got " .. type(lim))
    end
    local c = { limiter = lim, capacity = lim.capacity, rate = lim.rate }

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
    elseif type(cost) == "number" and cost == floor(cost) and cost >= 0 and cost <= EXACT_MAX then
        c.cost = cost
    else
        limit_error("cost must be a whole number from 0 to 2^53-1 or a function, got "
            .. describe(cost))
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
    c.window = headers.window(c.capacity, c.rate)
    local quoted
    ok, quoted = pcall(headers.quote, opts.name == nil
        and headers.default_name(c.capacity, c.rate) or opts.name)
    if not ok then
        limit_error(quoted)
    end
    c.quoted = quoted
    c.policy = headers.policy(quoted, c.capacity, c.window)
    c.memo, c.memo_n = {}, 0
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
        return "ip:" .. peer
    end
    local memo_key = value and peer .. "\n" .. value or peer
    local ident = c.memo[memo_key]
    if ident then
        return ident
    end
    ident = "ip:" .. (client_ip.key(ip, client_ip.resolve(ip, peer, value)) or "unknown")
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

local function hex(s)
    return (gsub(s, ".", function(ch)
        return format("%02x", string.byte(ch))
    end))
end

-- The bucket key of a request, as the Python package builds identities:
-- "ip:<address>" (IPv6 by its network) or "k:<value>", so that no header
-- value can name an address's bucket; one longer than a key may be becomes
-- "#<SHA-1>", which neither form can spell. nil: the request is exempt.
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
            ident = "k:" .. v
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
        ident = "k:" .. v
    end
    if #ident > KEY_MAX then
        return "#" .. hex(ngx.sha1_bin(ident))
    end
    return ident
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
    local key = key_of(c)
    if key == nil then
        return nil
    end
    local cost = c.cost
    if c.cost_fn then
        cost = c.cost_fn()
    end
    local d, err, code = c.limiter:allow(key, cost)
    if not d then
        log(ERR, "hirate: ", err, " (", code, ")")
        return ngx.exit(500)
    end
    if c.ctx then
        ngx.ctx.hirate = d
    end
    local t = headers.t(d)
    if c.headers then
        ngx_header["RateLimit-Policy"] = c.policy
        ngx_header["RateLimit"] = headers.item(c.quoted, d.remaining, t)
    end
    if c.legacy then
        ngx_header["X-RateLimit-Limit"] = headers.int(c.capacity)
        ngx_header["X-RateLimit-Remaining"] = headers.int(max(0, d.remaining))
        ngx_header["X-RateLimit-Reset"] = t and headers.int(t) or nil
    end
    if d.allowed then
        return d
    end
    if t then
        -- Retry-After belongs to a refusal, with the RateLimit headers or not.
        ngx_header["Retry-After"] = headers.int(t)
    end
    local body = c.body
    if type(body) == "function" then
        body = body(d)
    elseif body == nil then
        body = headers.refusal_text(d)
    end
    ngx.status = d.source == "fail_closed" and c.unavailable or c.status
    ngx_header["Content-Type"] = "text/plain; charset=utf-8"
    ngx.print(body)
    return ngx.exit(ngx.HTTP_OK)
end

return _M
