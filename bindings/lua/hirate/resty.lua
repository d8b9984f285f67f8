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
    endpoint, the credentials and the TLS settings (so limiters with another
    user, database or transport never share one); `pool_size` (default 16)
    idle connections are kept for `keepalive_timeout` seconds (default 60);
    `backlog`, when set, also caps open connections at `pool_size` and queues
    at most `backlog` waiting requests (lua-nginx-module's rule).
  * A new connection is the core's handshake op: the core says whether one
    may be opened now (its reconnect backoff), which bytes open it (AUTH,
    SELECT, PING) and what the replies mean; for rediss:// this module first
    runs sslhandshake (nginx's lua_ssl_trusted_certificate is the trust
    store), and when the core asks for a probe (a TLS/plain mismatch
    explains the failure) it opens a second connection with the other
    transport. A misconfiguration (EAUTH, ENOPERM, ETLS, EREFUSED,
    ENOTREDIS) is returned under every policy.
  * A timeout or a broken connection hands the call to the failure policy
    (op:fail) and the connection is closed; so is one the core marks for
    dropping, or one with bytes nobody asked for.
  * While the breaker is open the core needs no Redis: no I/O at all.
  * Over a Redis Cluster (redis+cluster://, rediss+cluster://) every node
    the core names has its own pool (named as above, after that node's
    address), its own handshake and backoff. An op goes in rounds of legs,
    at most one a node: every leg's request is sent first, each on a
    cosocket of its node, then each leg's replies are read, so the nodes
    work at once; the core says whether another round follows (after
    NOSCRIPT, MOVED or ASK) and which node answers what. All rounds of an
    op share one deadline, `timeout` from its first send. Which slot a key
    is in, what a redirection means and when the map is read again are the
    core's alone: this module knows no slot.
  * A Sentinel URL (redis+sentinel://, rediss+sentinel://) runs the same
    way: its nodes are the sentinels and the masters they name, each with
    its own pool and the handshake the core gives it (a sentinel's own
    credentials, sentinel_username and sentinel_password, and no SELECT; a
    master's AUTH, SELECT and ROLE). Which sentinel to ask, when to ask
    again and where the master is are the core's: this module knows no
    Sentinel command.
  * The core's log lines (Redis failed and the breaker opened at WARN, once
    per outage; Redis answers again at INFO; a Sentinel master found or
    moved at INFO, Redis Functions refused by a server at WARN) go to ngx.log, or to the `log`
    option's function(level, message) when one is given; the core queues
    them during a call and this module writes them once the call is done.

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
local headers = require "hirate.headers"
local response = headers.response
local client_ip = require "hirate.client_ip"

local ngx = ngx
local tcp = ngx.socket.tcp
local get_phase = ngx.get_phase
local ngx_now, update_time = ngx.now, ngx.update_time
local ngx_var, ngx_header = ngx.var, ngx.header
local log, ERR, WARN, INFO, DEBUG = ngx.log, ngx.ERR, ngx.WARN, ngx.INFO, ngx.DEBUG

local type, pairs, ipairs, setmetatable, getmetatable, error, tostring, tonumber, pcall = type,
    pairs, ipairs, setmetatable, getmetatable, error, tostring, tonumber, pcall
local concat = table.concat
local format, sub, find, match, lower, gsub = string.format, string.sub, string.find,
    string.match, string.lower, string.gsub
local floor, ceil, max = math.floor, math.ceil, math.max

local _M = { _VERSION = core.version() }

-- The core's limits, and the most a read takes at once (any reply the core
-- accepts fits in one).
local KEY_MAX, EXACT_MAX, RECV_MAX = core.KEY_MAX, core.EXACT_MAX, core.IO_REPLY_MAX

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
-- Talking to Redis through a cosocket. Every rule about what to send and
-- what a reply means is the core's (the handshake and call ops): this part
-- moves bytes, keeps time, and names its failures in the core's words.

-- A cosocket's failure, as the core's code. A connect failure is ECONNECT
-- whatever its cause: nothing was sent.
local function io_code(err)
    return err == "timeout" and "ETIMEDOUT" or "EIO"
end

-- sslhandshake's failures: the TLS library refused the peer (a
-- certificate, its name, the protocol, a server that speaks no TLS), unless
-- the connection itself timed out or broke.
local function tls_code(err)
    if err == "timeout" then
        return "ETIMEDOUT"
    elseif err == "closed" or find(err, "connection reset", 1, true)
        or find(err, "broken pipe", 1, true) then
        return "EIO"
    end
    return "ETLS"
end

-- Each failed I/O, at debug level: what an outage means is the core's to
-- say, once (its warning when the breaker opens, its info when Redis
-- answers again), and a misconfiguration is the call's own result; a line
-- per failed probe would say neither.
local function io_failed(self, what)
    log(DEBUG, "hirate: Redis at ", self.where, ": ", what)
end

-- Where the core's log lines go by default: nginx's error log.
local function ngx_writer(level, msg)
    log(level == "warning" and WARN or INFO, "hirate: ", msg)
end

-- Writes the lines the core queued during a call (none, nearly always: one
-- call of the C module finds that out).
local function drain(self)
    local lim = self.lim
    local level, msg = lim:_log_next()
    while level do
        pcall(self.log, level, msg) -- a log line must not cost the call its outcome
        level, msg = lim:_log_next()
    end
end

-- Milliseconds from now until deadline (at least 1), or nil once it passed.
local function left_ms(deadline)
    update_time()
    local left = deadline - ngx_now()
    if left <= 0 then
        return nil
    end
    return max(1, ceil(left * 1000))
end

-- Sends req, obj's request, and feeds obj (a handshake or an op) the
-- replies until it is done. The request has `timeout` seconds for its
-- whole reply from the moment it is sent: a reply that trickles in cannot
-- stretch it read by read. Returns true and whether bytes were left over,
-- or false, the code of the failure and the cosocket's words.
local function exchange(self, sock, obj, req, timeout)
    local ok, err = sock:send(req)
    if not ok then
        return false, io_code(err), "send: " .. err
    end
    local sent_at, shrunk = ngx_now(), false
    local buf = ""
    while true do
        local data
        data, err = sock:receiveany(RECV_MAX)
        if not data then
            return false, io_code(err), "receive: " .. err
        end
        if buf ~= "" then
            data = buf .. data
        end
        local state, used = obj:feed(data)
        buf = used < #data and sub(data, used + 1) or ""
        if state == "done" then
            return true, buf ~= ""
        elseif state == "send" then -- NOSCRIPT: the same calls again, the first as EVAL
            ok, err = sock:send(obj:request())
            if not ok then
                return false, io_code(err), "send: " .. err
            end
            sent_at = ngx_now()
            if shrunk then
                sock:settimeouts(self.connect_ms, self.timeout_ms, self.timeout_ms)
                shrunk = false
            end
        else
            local wait = left_ms(sent_at + timeout)
            if not wait then
                return false, "ETIMEDOUT", "receive: timeout"
            end
            sock:settimeouts(self.connect_ms, self.timeout_ms, wait)
            shrunk = true
        end
    end
end

-- A TLS name that is an address (IPv4, or IPv6 with its colons), which
-- nginx cannot check a certificate against.
local function is_address(name)
    return match(name, "^[%d.]+$") ~= nil or find(name, ":", 1, true) ~= nil
end

-- TLS on a connected cosocket: verify says whether the certificate and the
-- name are checked (against nginx's lua_ssl_trusted_certificate). Returns
-- true, or false, the code and the words of the failure.
local function start_tls(self, sock, verify, session)
    if self.client_cert then
        local ok, err = sock:setclientcert(self.client_cert, self.client_key)
        if not ok then
            return false, "ETLS", "client certificate: " .. err
        end
    end
    -- pcall: lua-resty-core 0.1.25 raises (an assertion) instead of
    -- returning an error when a handshake that completed at once fails its
    -- name check.
    local done, sess, err = pcall(sock.sslhandshake, sock, session, self.server_name, verify)
    if not done then
        return false, "ETLS", "the certificate check of " .. self.server_name
            .. " failed (nginx's error log says why)"
    elseif not sess and err then
        return false, tls_code(err), err
    end
    if session ~= false then
        self.tls_session = sess or nil -- resumed by the next new connection
    end
    return true
end

-- The core asked for a probe (HIRATE_IO_PROBE): the first connection failed
-- as a TLS mismatch would make it fail. The same address over the other
-- transport, on a connection of its own that is closed after (never pooled),
-- within probe_timeout; the core reads what it answers.
local function probe(self, hs)
    update_time()
    local deadline = ngx_now() + self.probe_timeout
    local wait = max(1, ceil(self.probe_timeout * 1000))
    local sock = tcp()
    sock:settimeouts(wait, wait, wait)
    local ok, err = sock:connect(self.host, self.port, self.probe_pool)
    if not ok then
        return hs:fail("ECONNECT", "probe: connect: " .. err)
    end
    local code, why
    if hs:probe_tls() then
        ok, code, why = start_tls(self, sock, false, false)
        if not ok then
            sock:close()
            return hs:fail(code, "probe: " .. why)
        end
    end
    wait = left_ms(deadline)
    if not wait then
        sock:close()
        return hs:fail("ETIMEDOUT", "probe: timeout")
    end
    sock:settimeouts(wait, wait, wait)
    ok, code, why = exchange(self, sock, hs, hs:request(), wait / 1000)
    sock:close()
    if not ok then
        hs:fail(code, "probe: " .. why)
    end
end

-- A new connection's handshake, the core's op: TLS first for rediss://
-- (connect_timeout covers the TCP connect and the TLS handshake together),
-- then the core's bytes (AUTH, SELECT, PING), whose replies it reads; the
-- probe when it asks for one. Returns true, or nil, message, code.
local function handshake(self, sock, hs, connect_started)
    local state
    if self.tls then
        local wait = left_ms(connect_started + self.connect_timeout)
        if not wait then
            state = hs:fail("ETIMEDOUT", "timeout")
        else
            sock:settimeouts(wait, wait, wait)
            local ok, code, why = start_tls(self, sock, self.tls_verify, self.tls_session)
            sock:settimeouts(self.connect_ms, self.timeout_ms, self.timeout_ms)
            if not ok then
                self.tls_session = nil
                state = hs:fail(code, why)
            end
        end
    end
    if not state then
        local ok, code, why = exchange(self, sock, hs, hs:request(), self.timeout)
        if not ok then
            state = hs:fail(code, why)
        end
    end
    if state == "probe" then
        probe(self, hs)
    end
    return hs:result()
end

-- A connection ready for calls: an idle one from the pool, or a new one
-- through the core's handshake. self is the limiter (a single Redis) or one
-- of a cluster's nodes (node_of). Returns it, or nil, code, message.
local function open(self)
    local lim = self.lim
    local hs, msg, code
    if not self.healthy then
        -- The last new connection failed: ask the core before connecting,
        -- so that its backoff spares Redis the connection too.
        hs, msg, code = lim:_handshake_start(self.node)
        if not hs then
            return nil, code, msg
        end
    end
    local started
    if self.tls then
        update_time()
        started = ngx_now()
    end
    local sock = tcp()
    sock:settimeouts(self.connect_ms, self.timeout_ms, self.timeout_ms)
    local ok, err = sock:connect(self.host, self.port, self.pool_opts)
    if not ok then
        self.healthy = false
        io_failed(self, "connect: " .. err)
        if not hs then
            -- Connecting came first (a pooled connection needs no
            -- handshake): the core still hears of the failure, for its
            -- backoff, and words it.
            hs, msg, code = lim:_handshake_start(self.node)
            if not hs then
                return nil, code, msg
            end
        end
        hs:fail("ECONNECT", err)
        ok, msg, code = hs:result()
        hs:free()
        return nil, code, msg
    end
    if sock:getreusedtimes() > 0 then
        if hs then
            hs:free() -- not needed: it taught the core nothing
        end
        return sock
    end
    if not hs then
        hs, msg, code = lim:_handshake_start(self.node)
        if not hs then
            sock:close()
            return nil, code, msg
        end
    end
    ok, msg, code = handshake(self, sock, hs, started)
    hs:free()
    if not ok then
        self.healthy = false
        sock:close()
        io_failed(self, msg)
        return nil, code, msg
    end
    self.healthy = true
    return sock
end

-- Runs op to the end: a connection, its request(s), the replies.
local function converse(self, op)
    local req = op:request()
    if not req then
        return -- decided without Redis (bad items, the deny cache, an open breaker)
    end
    local sock, code, msg = open(self)
    if not sock then
        return op:fail(code, msg)
    end
    local ok, left, why = exchange(self, sock, op, req, self.timeout)
    if not ok then
        sock:close()
        self.healthy = false
        io_failed(self, why)
        return op:fail(left, why) -- the core's line names the node
    end
    -- A connection is reused only in a known state: nothing left unread,
    -- nothing the core distrusts.
    if left or op:drop() then
        sock:close()
    elseif not sock:setkeepalive(self.keepalive_ms, self.pool_size) then
        sock:close()
    end
end

---------------------------------------------------------------------------
-- A Redis Cluster or a Sentinel service: nodes and the rounds of an op.

-- What node n of the limiter needs to be connected to: the fields open()
-- reads that are a node's own (address, pool, health, TLS session and
-- name); the rest (timeouts, TLS settings, the C limiter) are the
-- limiter's, through __index. Made when the core first names the node (a
-- node's endpoint never changes). Returns it, or nil, code, message.
local function node_of(self, n)
    local nd = self.nodes[n]
    if nd then
        return nd
    end
    local ep, msg, code = self.lim:_endpoint(n)
    if not ep then
        return nil, code, msg
    end
    if ep.tls and ep.tls_verify and is_address(ep.tls_server_name) then
        -- The map or the sentinels name nodes by address; new() checked only
        -- the URL's first host.
        return nil, "ETLS", (self.sentinel and "the sentinels name the master "
            or "the cluster names node ") .. ep.where .. " by its address, and "
            .. "nginx checks a certificate against a host name only: give the name the "
            .. "nodes' certificates are for as tls_server_name"
    end
    local pool = self.pool_name(ep)
    nd = setmetatable({
        node = n,
        where = ep.where,
        host = ep.path and "unix:" .. ep.path or ep.host,
        port = not ep.path and ep.port or nil,
        server_name = ep.tls_server_name,
        pool_opts = { pool = pool, pool_size = self.pool_size, backlog = self.backlog },
        probe_pool = { pool = pool .. ":probe" },
    }, self.node_mt)
    self.nodes[n] = nd
    return nd
end

-- Reads a leg's replies from sock and feeds them to op until the leg is
-- done, by deadline. Returns true and whether bytes were left over, or
-- false, the code of the failure and the cosocket's words.
local function receive_leg(self, sock, op, leg, deadline)
    local buf = ""
    while true do
        local wait = left_ms(deadline)
        if not wait then
            return false, "ETIMEDOUT", "receive: timeout"
        end
        sock:settimeouts(self.connect_ms, self.timeout_ms, wait)
        local data, err = sock:receiveany(RECV_MAX)
        if not data then
            return false, io_code(err), "receive: " .. err
        end
        if buf ~= "" then
            data = buf .. data
        end
        local state, used = op:leg_feed(leg, data)
        buf = used < #data and sub(data, used + 1) or ""
        if state == "done" then
            return true, buf ~= ""
        end
    end
end

-- An op over nodes (a cluster's, a Sentinel service's): round by round,
-- every leg's request sent first (each on a connection of its own node),
-- then every leg's replies read, until the core says every item is decided.
-- One deadline for all of it, from the first send.
local function rounds(self, op)
    local deadline
    repeat
        local n = op:legs()
        local socks, nodes = {}, {}
        for leg = 1, n do
            local nd, sock, code, msg
            nd, code, msg = node_of(self, op:leg_node(leg))
            if nd then
                sock, code, msg = open(nd)
            end
            if sock and deadline and not left_ms(deadline) then
                -- Not sent, so it provably did not run; the op's time is up.
                sock:setkeepalive(self.keepalive_ms, self.pool_size)
                sock, code, msg = nil, "ETIMEDOUT", "no time left for the call"
            end
            if sock then
                local ok, err = sock:send(op:leg_request(leg))
                if ok then
                    if not deadline then
                        update_time()
                        deadline = ngx_now() + self.timeout
                    end
                    socks[leg], nodes[leg] = sock, nd
                else
                    sock:close()
                    nd.healthy = false
                    io_failed(nd, "send: " .. err)
                    code, msg = io_code(err), "send: " .. err
                end
            end
            if not socks[leg] then
                op:leg_fail(leg, code, msg)
            end
        end
        for leg = 1, n do
            local sock = socks[leg]
            if sock then
                local nd = nodes[leg]
                local ok, left, why = receive_leg(self, sock, op, leg, deadline)
                if not ok then
                    sock:close()
                    nd.healthy = false
                    io_failed(nd, why)
                    op:leg_fail(leg, left, why)
                elseif left or op:leg_drop(leg)
                        or not sock:setkeepalive(self.keepalive_ms, self.pool_size) then
                    sock:close()
                end
            end
        end
    until op:next() ~= "send"
end

-- Runs op (from lim:_op_start or _op_start_reset) and returns what
-- outcome(op) makes of it.
local function run(self, op, outcome)
    local ok, err = pcall(self.nodes and rounds or converse, self, op)
    if not ok then
        -- A Lua error mid-I/O (out of memory, say): the outcome is unknown.
        op:fail("EIO", "a Lua error during the I/O")
        op:free()
        drain(self)
        error(err, 0)
    end
    local a, b, c = outcome(op)
    op:free()
    drain(self)
    return a, b, c
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
--- 60; 0 keeps it for ever) and backlog (see above); log, when not given,
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
        writer = ngx_writer
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
-- limit{...}: one limit on the current request, from access_by_lua*.

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
        local made, l = pcall(_M.new, lim)
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

-- The bucket key of a request: the core's identities ("ip:<address>",
-- IPv6 by its network, or "k:<value>") and keys ("{<identity>}", a Redis
-- Cluster hash tag; a long identity hashed with SHA-256), as in Python.
-- nil: the request is exempt.
local bucket_key = core.bucket_key

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
