--[[
hirate.resty: hirate inside OpenResty (nginx with lua-nginx-module).

`require "hirate"` returns this module's limiter when `ngx` exists. It is the
C limiter of `hirate.core` for everything but I/O: validation, the deny cache,
the circuit breaker and the failure policy are the core's own, and the core
encodes the script call and decodes the reply (the sans-IO "op" hooks). The
bytes travel through nginx cosockets, so a slow or stopped Redis never blocks
the worker: a round trip is bounded by the limiter's timeouts and other
requests go on meanwhile.

The module is in three files, by job:

  * hirate/resty.lua (this file): hirate.new, the limiter's methods and
    their arguments, and the module's API (limit{} and its helpers are
    re-exported from hirate/resty/limit.lua);
  * hirate/resty/driver.lua: the cosocket driver, every byte to and from
    Redis (pooled connections, the pipelined connection, the rounds of a
    Redis Cluster or a Sentinel service);
  * hirate/resty/limit.lua: the limit{} middleware (the access-phase
    handler, its keys, headers and response; reset, refund, peek, charge).

Cosockets exist only in the rewrite, access, content and timer phases (and
the ssl_* certificate/session phases). A Redis-backed limiter called anywhere
else (init, init_worker, set, header_filter, body_filter, log, balancer)
raises an error naming the phase, rather than blocking the worker or quietly
answering from a per-worker bucket: run it from access_by_lua*, or defer it
with ngx.timer.at(0, ...). A limiter without a URL (in memory) does no I/O
and works in every phase.

limit{...} applies a limit to the current request from access_by_lua* (see
docs/lua.md, "OpenResty"): a limiter's one decision, of one band or of
several (hirate.new{limits = ...}), with RateLimit headers that list every
band.
]]

local core = require "hirate.core"
local driver = require "hirate.resty.driver"
local limit = require "hirate.resty.limit"

local ngx = ngx
local get_phase = ngx.get_phase

local type, pairs, ipairs, setmetatable, error, tostring, tonumber, pcall = type, pairs,
    ipairs, setmetatable, error, tostring, tonumber, pcall
local concat = table.concat
local format, sub, gsub = string.format, string.sub, string.gsub
local floor, max = math.floor, math.max

local run, is_address = driver.run, driver.is_address

local _M = { _VERSION = core.version() }

local key_error, cost_error = core.key_error, core.cost_error
local KEY_MAX, EXACT_MAX = core.KEY_MAX, core.EXACT_MAX

-- The phases in which lua-nginx-module offers cosockets.
local COSOCKET_PHASES = {
    rewrite = true, server_rewrite = true, access = true, content = true, timer = true,
    ssl_cert = true, ssl_session_fetch = true, ssl_client_hello = true, preread = true,
}

-- Options this module takes; the rest go to the C limiter, which names any
-- it does not know.
local OWN_OPTIONS = { keepalive_timeout = true, backlog = true, pipeline = true }

local Limiter = {}
local limiter_mt = { __index = Limiter }

function limiter_mt.__tostring(self)
    return tostring(self.lim)
end

---------------------------------------------------------------------------
-- Arguments: checked here so that messages name the method the caller
-- used, with the core's wording.

-- Errors point at the caller's line, as the C module's do in plain Lua:
-- at the first stack level outside this file and those of hirate/resty/
-- (none when that is a C function, pcall say).
local THIS = debug.getinfo(1, "S").source
local HERE = sub(THIS, 1, -5) .. "/" -- "@.../hirate/resty/"

local function raise(msg)
    local level = 2
    while true do
        local info = debug.getinfo(level, "S")
        if not info or (info.source ~= THIS and sub(info.source, 1, #HERE) ~= HERE) then
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

-- The core's rules and words for a key and a cost (what is "key" or
-- "item 2: key"), raised in the name of this module's function. The usual
-- key and cost pass without a call into C (about 90 ns a call, where the
-- JIT-compiled test takes under 1); anything else is the core's to judge.
local function check_key(key, fname, n, what)
    if type(key) == "string" and #key > 0 and #key <= KEY_MAX then
        return
    end
    local msg = key_error(key, what)
    if msg then
        arg_error(fname, n, msg)
    end
end

local function check_cost(cost, fname, n, what)
    if cost == nil then
        return 1
    end
    if type(cost) == "number" and cost >= 0 and cost <= EXACT_MAX and cost == floor(cost) then
        return cost
    end
    local msg = cost_error(cost, what)
    if msg then
        arg_error(fname, n, msg)
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

local function results(op)
    return op:results()
end

local function result(op)
    return op:result()
end

-- Every item's outcome, or nil, message, code when nothing was tried (a
-- closed limiter). with_bands: a decision of several bands has each band's
-- figures (allow, peek), as in plain Lua; allow_many's have the whole's.
local function run_items(self, items, spend, now_us, with_bands)
    local op, msg, code = self.lim:_op_start(items, spend, now_us, with_bands)
    if not op then
        return nil, msg, code
    end
    return run(self, op, results)
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
    local ds, msg, code = run_items(self, items, spend, now_us, true)
    item[1] = nil
    if not ds then
        return nil, msg, code
    end
    local d = ds[1]
    if d.message then
        return nil, d.message, d.error -- this call's own error (EAUTH, ETLS ...)
    end
    return d
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

local function read_file(path, name)
    local f, err = io.open(path, "rb")
    if not f then
        arg_error("new", 1, format("%s: %s", name, err))
    end
    local s = f:read("*a")
    f:close()
    return s
end

-- The client certificate and key of mutual TLS, parsed once, as
-- tcpsock:setclientcert takes them.
local function client_cert(ep)
    local ssl = require "ngx.ssl"
    local cert, err = ssl.parse_pem_cert(read_file(ep.tls_cert_file, "tls_cert_file"))
    if not cert then
        arg_error("new", 1, format("tls_cert_file %s: %s", ep.tls_cert_file, err))
    end
    local key
    key, err = ssl.parse_pem_priv_key(read_file(ep.tls_key_file, "tls_key_file"))
    if not key then
        arg_error("new", 1, format("tls_key_file %s: %s", ep.tls_key_file, err))
    end
    return cert, key
end

--- hirate.new{...} inside OpenResty. The options are those of the C limiter
--- plus keepalive_timeout (seconds an idle pooled connection is kept, default
--- 60; 0 keeps it for ever), backlog (see above) and pipeline (true or false;
--- true, the default, for one Redis server; refused for a Redis Cluster or a
--- Sentinel service); log, when not given,
--- is nginx's error log. tls_ca_file and tls_ca_dir are refused: cosockets
--- trust what nginx's lua_ssl_trusted_certificate names, for every socket of
--- the worker. shared = true (the in-memory buckets shared by every worker)
--- is for a limiter made in init_by_lua*, in the master, before the workers
--- fork: made anywhere else, each worker would have a table of its own.
function _M.new(opts)
    if type(opts) ~= "table" then
        arg_error("new", 1, "table expected, got " .. type(opts))
    end
    if opts.shared == true and get_phase() ~= "init" then
        arg_error("new", 1, "shared = true shares the buckets with the workers nginx forks "
            .. "after the limiter is made: make it in init_by_lua*, not in " .. get_phase())
    end
    local keepalive = check_seconds(opts, "keepalive_timeout", 60, 0, 86400)
    local backlog = opts.backlog
    if backlog ~= nil and (type(backlog) ~= "number" or backlog ~= floor(backlog)
            or backlog < 1 or backlog > 65535) then
        arg_error("new", 1, "backlog must be a whole number from 1 to 65535, got "
            .. describe(backlog))
    end
    local pipeline = opts.pipeline
    if pipeline ~= nil and type(pipeline) ~= "boolean" then
        arg_error("new", 1, "pipeline must be true or false, got " .. describe(pipeline))
    end
    local copy = {}
    for k, v in pairs(opts) do
        if not OWN_OPTIONS[k] then
            copy[k] = v
        end
    end
    -- The core queues its log lines for this function (it checks the
    -- option's type); drain() writes them.
    local writer = opts.log
    if writer == nil then
        writer = driver.ngx_writer
    end
    copy.log = writer
    local made, lim = pcall(make_core, copy)
    if not made then
        -- The core's message, at the caller's line rather than this one's.
        raise((gsub(tostring(lim), "^[^\n]-:%d+: ", "", 1)))
    end
    local self = setmetatable({
        lim = lim,
        items = { {} },
        log = writer,
    }, limiter_mt)
    local ok, ep = pcall(lim._endpoint, lim)
    if not ok or type(ep) ~= "table" then
        self.memory = true -- no URL: the C limiter decides alone, without I/O
        return self
    end
    for _, name in ipairs({ "tls_ca_file", "tls_ca_dir" }) do
        if ep[name] then
            lim:close()
            arg_error("new", 1, name .. " cannot be honoured inside nginx: cosockets trust "
                .. "the CAs that the lua_ssl_trusted_certificate directive names (with "
                .. "lua_ssl_verify_depth); name the file there and leave " .. name .. " out")
        end
    end
    self.connect_ms = max(1, floor(ep.connect_timeout * 1000 + 0.5))
    self.timeout_ms = max(1, floor(ep.timeout * 1000 + 0.5))
    self.connect_timeout = ep.connect_timeout
    self.timeout = ep.timeout
    self.probe_timeout = ep.probe_timeout
    self.where = ep.where
    if ep.path then
        self.host, self.port = "unix:" .. ep.path, nil
    else
        self.host, self.port = ep.host, ep.port
    end
    if ep.tls then
        self.tls, self.tls_verify, self.server_name = true, ep.tls_verify, ep.tls_server_name
        if ep.tls_verify and is_address(ep.tls_server_name) then
            lim:close()
            arg_error("new", 1, "tls_server_name: nginx checks a certificate against a host "
                .. "name only, not an address such as " .. ep.tls_server_name .. "; give the "
                .. "name the certificate is for as tls_server_name")
        end
        if ep.tls_cert_file then
            self.client_cert, self.client_key = client_cert(ep)
        end
    end
    self.pool_size = opts.pool_size or 16
    self.backlog = backlog
    self.keepalive_ms = floor(keepalive * 1000 + 0.5)
    -- One pool per endpoint, credentials and transport: connections made for
    -- one user, database or TLS setting never serve another. The digest
    -- keeps the passwords out of the pool's name. A cluster's or a Sentinel
    -- service's nodes each get theirs, named by the node's endpoint
    -- (pool_size each); the sentinels' credentials are part of it too.
    local url = opts.url
    local sentinel_id = concat({ opts.sentinel_username or "", opts.sentinel_password or "" },
        "\n")
    self.pool_name = function(e)
        local id = concat({ url, tostring(e.tls), tostring(e.tls_verify),
            e.tls_server_name or "", e.tls_cert_file or "", e.tls_key_file or "",
            sentinel_id }, "\n")
        return "hirate:" .. e.where .. (e.tls and ":tls:" or ":") .. ngx.md5(id)
    end
    local pool = self.pool_name(ep)
    self.pool_opts = { pool = pool, pool_size = self.pool_size, backlog = backlog }
    -- The mismatch probe's connections: a pool nothing is ever put into,
    -- so that connect() never hands it an idle connection of another.
    self.probe_pool = { pool = pool .. ":probe" }
    if lim:_is_cluster() or lim:_is_sentinel() then
        self.sentinel = lim:_is_sentinel()
        self.nodes = {} -- by the core's node number (node_of)
        self.node_mt = { __index = self }
        if pipeline == true then
            lim:close()
            arg_error("new", 1, "pipeline = true shares one connection to one Redis server, "
                .. "and this URL names a " .. (self.sentinel and "Sentinel service" or "Redis Cluster")
                .. ": leave pipeline out (each request takes a pooled connection of the node "
                .. "the core names)")
        end
    elseif pipeline ~= false then
        require "ngx.semaphore" -- the pipeline's callers wait on one (lua-resty-core)
        self.pipeline = true
    end
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

--- refund(key, tokens): gives tokens (default 1) back to every band of
--- key's bucket, each capped at its capacity, over the cosockets; the
--- decision is the bucket after. Or nil, message, code (an outage under
--- on_error "open" or "closed": the tokens were not given back).
function Limiter:refund(key, tokens)
    if self.memory then
        return self.lim:refund(key, tokens)
    end
    return decide(self, key, tokens, "refund", nil, "refund")
end

--- allow_many{ {key, cost}, ... }: every item in one pipelined round trip.
--- Each item's outcome: its decision, or its error
--- ({allowed = false, error = code, message = ...}).
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
    return run_items(self, items, true, nil)
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
    local op, msg, code = self.lim:_op_start_reset(key)
    if not op then
        return nil, msg, code
    end
    return run(self, op, result)
end

local function health(op)
    return op:health()
end

--- check(): the core's health check over cosockets (see hirate.core's
--- lim:check()): one round trip to every node decisions go to; the health
--- table, or nil, message, code when the limiter is closed.
function Limiter:check()
    if self.memory then
        return self.lim:check()
    end
    if self.closed then
        return nil, "limiter is closed", "ECLOSED"
    end
    check_phase("check")
    local op, msg, code = self.lim:_op_start_check()
    if not op then
        return nil, msg, code
    end
    return run(self, op, health)
end

--- _decide_at(key, cost, spend, now_us): a decision at an injected time,
--- through the same cosocket path (the test vectors).
function Limiter:_decide_at(key, cost, spend, now_us)
    if self.memory then
        return self.lim:_decide_at(key, cost, spend, now_us)
    end
    return decide(self, key, cost, spend, now_us, "_decide_at")
end

--- bands(): the limiter's bands, { {capacity =, rate =, name =}, ... }
--- (one for capacity and rate), as the core holds them.
function Limiter:bands()
    return self.lim:bands()
end

--- stats(): the core's metrics of this limiter (see hirate.core's
--- lim:stats()): the cosocket path's ops are counted as the blocking
--- client's calls are, each leg of an op one round trip.
function Limiter:stats()
    return self.lim:stats()
end

function Limiter:_stats()
    return self.lim:_stats()
end

function Limiter:_endpoint(node)
    return self.lim:_endpoint(node)
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
-- limit{...} and its helpers (hirate/resty/limit.lua), over this module's
-- limiters.

limit.use{ new = _M.new, limiter_mt = limiter_mt, raise = raise, arg_error = arg_error,
    describe = describe }
_M.limit, _M.charge, _M.reset, _M.refund, _M.peek, _M.client_address = limit.limit,
    limit.charge, limit.reset, limit.refund, limit.peek, limit.client_address

return _M
