--[[
hirate.resty.driver: the cosocket driver of hirate.resty, every byte
between nginx and Redis. Every rule about what to send and what a reply
means is the core's (the handshake and call ops of hirate.core): this file
moves bytes, keeps time, and names its failures in the core's words.

  * A limiter of one Redis server pipelines (pipeline, default true): the
    calls of the requests a worker serves at once share one connection of
    the limiter's, written together and answered in order by one reader
    (see "pipeline" below). pipeline = false, and a Redis Cluster or a
    Sentinel service, take the per-request path: a pooled connection and a
    round trip of each call's own.
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

Its one entry is run(self, op, outcome), where self is a limiter of
hirate.resty (lim, the C limiter; the endpoint, timeouts, TLS settings and
pools hirate.new put in it; nodes for a Redis Cluster or a Sentinel
service; pipeline) and op an op of the C limiter's.
]]

local core = require "hirate.core"

local ngx = ngx
local tcp = ngx.socket.tcp
local get_phase = ngx.get_phase
local ngx_now, update_time = ngx.now, ngx.update_time
local log, ERR, WARN, INFO, DEBUG = ngx.log, ngx.ERR, ngx.WARN, ngx.INFO, ngx.DEBUG

local setmetatable, error, pcall = setmetatable, error, pcall
local concat = table.concat
local sub, find, match = string.sub, string.find, string.match
local ceil, max = math.ceil, math.max

local _M = {}

-- The most a read takes at once (any reply the core accepts fits in one).
local RECV_MAX = core.IO_REPLY_MAX

---------------------------------------------------------------------------
-- Talking to Redis through a cosocket.

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

---------------------------------------------------------------------------
-- pipeline = true: one shared connection per limiter and worker. The
-- requests of concurrent calls are written together on it, in the order
-- they came; one reader feeds the replies, in the same order, to their ops
-- and wakes each caller (a semaphore of its own). A cosocket belongs to
-- the request that made it, so the connection lives in a timer of its own
-- (two light threads: the writer and the reader). Nothing is ever sent
-- again on another connection: a call whose reply is in doubt fails.
--
-- conn.queue[conn.head .. conn.tail] are the calls on the connection, in
-- the order their requests go out; the writer has written those up to
-- conn.sent. A slot is a call: its op, its semaphore, its deadline, and
-- sent (its request is written: a reply will come), done (its caller has
-- its outcome), abandoned (its caller's time ran out first). A call
-- abandoned before its request was written is taken off the line unsent:
-- nothing about it is in doubt, and the connection goes on.

local semaphore
local timer_at = ngx.timer and ngx.timer.at
local exiting = ngx.worker and ngx.worker.exiting
local spawn, wait_thread = ngx.thread and ngx.thread.spawn, ngx.thread and ngx.thread.wait

-- Where a caller may wait on a semaphore (and so use the pipeline); the
-- other cosocket phases take the per-request path.
local PIPE_PHASES = { rewrite = true, server_rewrite = true, access = true, content = true,
    timer = true }

-- How long the reader waits for bytes while nothing is in flight, before it
-- looks whether the worker is exiting (a reload), the limiter closed, or
-- the connection has been idle for keepalive_timeout.
local IDLE_MS = 1000

-- Fails every call still waiting on conn (their op's fail path: the policy
-- and the breaker decide), wakes them, and closes the connection.
local function pipe_fail(self, conn, code, why)
    if conn.dead then
        return
    end
    conn.dead = true
    if self.pipe == conn then
        self.pipe = nil
    end
    if why then
        self.healthy = false
        io_failed(self, why)
    end
    local q = conn.queue
    for i = conn.head, conn.tail do
        local slot = q[i]
        q[i] = nil
        if slot and not slot.done and not slot.abandoned then
            slot.done = true
            slot.op:fail(code, why or "the connection closed")
            slot.sema:post(1)
        end
    end
    conn.head, conn.tail, conn.sent = 1, 0, 0
    conn.wake:post(1) -- the writer ends
    if conn.sock then
        conn.sock:close()
    end
end

-- Appends slot, whose request is req, to conn: written by the writer,
-- answered in order.
local function pipe_push(conn, slot, req)
    slot.req, slot.sent = req, false
    local tail = conn.tail + 1
    conn.queue[tail], conn.tail = slot, tail
    if tail == conn.sent + 1 then -- the writer has nothing else to write
        conn.wake:post(1)
    end
end

-- Writes what was queued since its last write, in one send: every call but
-- those abandoned meanwhile, which are marked never to be answered.
local function pipe_writer(self, conn)
    local sock, q = conn.sock, conn.queue
    local out = {}
    while not conn.dead do
        local from, to = max(conn.sent + 1, conn.head), conn.tail
        if from > to then
            conn.wake:wait(IDLE_MS / 1000)
        else
            local n = 0
            for i = from, to do
                local slot = q[i]
                if slot.abandoned then
                    slot.skip = true
                else
                    n = n + 1
                    out[n] = slot.req
                    slot.sent = true
                end
                slot.req = nil
            end
            conn.sent = to
            if n > 0 then
                local ok, err = sock:send(n == 1 and out[1] or concat(out, "", 1, n))
                for i = 1, n do
                    out[i] = nil
                end
                if not ok then
                    return pipe_fail(self, conn, io_code(err), "send: " .. err)
                end
            end
        end
    end
end

-- The call whose reply comes next: the queue's head, after taking off the
-- calls that will get none (abandoned before they were written).
local function pipe_head(conn)
    local q = conn.queue
    local slot = q[conn.head]
    while slot and (slot.skip or (slot.abandoned and not slot.sent)) do
        slot.skip = true
        q[conn.head] = nil
        conn.head = conn.head + 1
        slot = q[conn.head]
    end
    if not slot and conn.head > conn.tail then
        conn.head, conn.tail, conn.sent = 1, 0, 0
    end
    return slot
end

local function pipe_reader(self, conn)
    local sock, q = conn.sock, conn.queue
    local buf = ""
    update_time()
    local idle_since = ngx_now()
    while not conn.dead do
        local slot = pipe_head(conn)
        local wait
        if slot then
            wait = left_ms(slot.deadline)
            if not wait then
                if slot.sent then
                    return pipe_fail(self, conn, "ETIMEDOUT", "receive: timeout")
                end
                wait = 1 -- not written yet: its caller takes it back
            end
        elseif conn.closing or self.closed or exiting() then
            return pipe_fail(self, conn, "EIO", nil) -- idle: nothing in doubt
        else
            wait = IDLE_MS
            if self.keepalive_ms > 0 then
                local left = left_ms(idle_since + self.keepalive_ms / 1000)
                if not left then
                    return pipe_fail(self, conn, "EIO", nil) -- idle for keepalive_timeout
                end
                wait = left < wait and left or wait
            end
        end
        sock:settimeouts(self.connect_ms, self.timeout_ms, wait)
        local data, err = sock:receiveany(RECV_MAX)
        if not data then
            if err ~= "timeout" then
                return pipe_fail(self, conn, io_code(err), "receive: " .. err)
            end
            -- a timeout: the loop looks at the head's deadline again
        else
            if buf ~= "" then
                data = buf .. data
                buf = ""
            end
            while data ~= "" do
                slot = pipe_head(conn)
                if not slot or not slot.sent then
                    -- Bytes nobody asked for: the connection is not in a
                    -- known state.
                    return pipe_fail(self, conn, "EIO", "receive: bytes nobody asked for")
                elseif slot.abandoned then
                    -- Its caller's time ran out: the replies after it cannot
                    -- be told apart.
                    return pipe_fail(self, conn, "ETIMEDOUT", "receive: timeout")
                end
                local op = slot.op
                local state, used = op:feed(data)
                data = used < #data and sub(data, used + 1) or ""
                if state == "done" then
                    q[conn.head] = nil
                    conn.head = conn.head + 1
                    slot.done = true
                    if op:drop() then
                        conn.closing = true
                        if self.pipe == conn then
                            self.pipe = nil
                        end
                    end
                    slot.sema:post(1)
                elseif state == "send" then
                    -- NOSCRIPT: the script did not run; the op's next request
                    -- (EVAL) goes at the end of the line.
                    q[conn.head] = nil
                    conn.head = conn.head + 1
                    pipe_push(conn, slot, op:request())
                else
                    buf, data = data, ""
                end
            end
            if not pipe_head(conn) then
                if conn.closing then
                    return pipe_fail(self, conn, "EIO", nil)
                end
                update_time()
                idle_since = ngx_now()
            end
        end
    end
end

-- The connection's timer: the core's handshake (open), then the writer and
-- the reader until the connection closes. A Lua error in any of it (out of
-- memory, say) fails the calls on the connection, as an I/O error would.
local function pipe_run(premature, self, conn)
    local sock, code, msg
    if not premature then
        sock, code, msg = open(self)
    else
        code, msg = "EIO", "the worker is exiting"
    end
    if not sock then
        return pipe_fail(self, conn, code, msg)
    end
    conn.sock = sock
    conn.connected = true
    local w = spawn(function()
        local ok, err = pcall(pipe_writer, self, conn)
        if not ok then
            pipe_fail(self, conn, "EIO", "a Lua error during the I/O")
            error(err, 0)
        end
    end)
    local ok, err = pcall(pipe_reader, self, conn)
    if not conn.dead then
        pipe_fail(self, conn, "EIO", not ok and "a Lua error during the I/O" or nil)
    end
    wait_thread(w)
    sock:close() -- when the writer was still sending as the reader closed it
    if not ok then
        error(err, 0)
    end
end

local function pipe_main(premature, self, conn)
    local ok, err = pcall(pipe_run, premature, self, conn)
    if not conn.dead then
        pipe_fail(self, conn, "EIO", "a Lua error during the I/O")
    end
    if not ok then
        log(ERR, "hirate: the pipelined connection to ", self.where, ": ", err)
    end
end

-- The connection calls join now: the open one, or a new one (nil when no
-- timer can be started, an exiting worker say: then the per-request path).
local function pipe_conn(self)
    local conn = self.pipe
    if conn and not conn.dead and not conn.closing and not conn.doubt then
        return conn
    end
    semaphore = semaphore or require "ngx.semaphore"
    conn = { queue = {}, head = 1, tail = 0, sent = 0, wake = semaphore.new(0) }
    local ok = timer_at(0, pipe_main, self, conn)
    if not ok then
        return nil
    end
    self.pipe = conn
    return conn
end

-- Runs op on the shared connection; false when it cannot (then the caller
-- takes the per-request path). The call's own deadline, `timeout` from its
-- start (plus connect_timeout while the connection is being opened).
local function pipelined(self, op)
    if not PIPE_PHASES[get_phase()] then
        return false
    end
    local req = op:request()
    if not req then
        return true -- decided without Redis
    end
    local conn = pipe_conn(self)
    if not conn then
        return false
    end
    update_time()
    local slot = {
        op = op, sema = semaphore.new(0),
        deadline = ngx_now() + self.timeout + (conn.connected and 0 or self.connect_timeout),
    }
    pipe_push(conn, slot, req)
    while not slot.done do
        local left = slot.deadline - ngx_now()
        if left > 0 then
            slot.sema:wait(left)
        end
        update_time()
        if not slot.done and ngx_now() >= slot.deadline then
            slot.abandoned = true
            if slot.sent then
                -- Its reply is in doubt, and so are those after it on conn:
                -- no more calls join it, and its reader closes it.
                conn.doubt = true
                if self.pipe == conn then
                    self.pipe = nil
                end
            end -- else never written: the writer leaves it out
            op:fail("ETIMEDOUT", slot.sent and "receive: timeout" or "no time left for the call")
            return true
        end
    end
    return true
end

-- Runs op (from lim:_op_start or _op_start_reset) and returns what
-- outcome(op) makes of it.
local function run(self, op, outcome)
    local ok, err
    if self.pipeline then
        ok, err = pcall(pipelined, self, op)
        if ok and not err then
            ok, err = pcall(converse, self, op)
        end
    else
        ok, err = pcall(self.nodes and rounds or converse, self, op)
    end
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

_M.run = run
_M.is_address = is_address
_M.ngx_writer = ngx_writer

return _M
