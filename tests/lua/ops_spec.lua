-- The hooks of the OpenResty path, driven as hirate/resty.lua drives them but
-- through helpers/resp_relay.py instead of a cosocket: the limiter gives the
-- request bytes, the test carries them to its own redis-server, and the
-- limiter reads the replies, keeping the breaker, the deny cache and the
-- failure policy as its own client does.
local hirate = require "hirate"
local core = require "hirate.core"
local support = require "helpers.support"
local redis_server = require "helpers.redis_server"

local pack = support.pack

-- Sends op's requests through srv and feeds it the replies one byte at a time,
-- so that every "more" is taken. Returns how many requests were sent and the
-- states feed returned, in order, without repeats.
local function drive(srv, op)
    local sent, states = 0, {}
    local req = op:request()
    while req do
        sent = sent + 1
        local replies = srv:relay(req)
        local buf, state, used = "", nil, 0
        for i = 1, #replies do
            buf = buf .. replies:sub(i, i)
            state, used = op:feed(buf)
            buf = buf:sub(used + 1)
            if states[#states] ~= state then states[#states + 1] = state end
            if state ~= "more" then break end
        end
        assert.equal("", buf)   -- no byte nobody asked for
        req = state == "send" and op:request() or nil
    end
    return sent, states
end

describe("the op hooks", function()
    local srv
    setup(function()
        srv = redis_server.start()
    end)
    teardown(function()
        if srv then srv:close() end
    end)
    before_each(function()
        srv:cli("FLUSHALL")
        srv:cli("SCRIPT", "FLUSH")
    end)

    local function limiter(extra)
        local o = { url = srv.url, capacity = 3, rate = 0.001, on_error = "closed",
            prefix = "op:" }
        for k, v in pairs(extra or {}) do
            o[k] = v
        end
        return hirate.new(o)
    end

    it("give the decisions the C client gives, NOSCRIPT handled once", function()
        local lim = limiter()
        local want = { { 1, 2, "redis" }, { 1, 1, "redis" }, { 1, 0, "redis" } }
        for i = 1, 3 do
            local op = lim:_op_start({ { "alice", 1 } }, true)
            local sent, states = drive(srv, op)
            -- A fresh server: the first request meets NOSCRIPT, then EVAL.
            assert.equal(i == 1 and 2 or 1, sent)
            assert.same(i == 1 and { "more", "send", "more", "done" } or { "more", "done" },
                states)
            assert.is_false(op:drop())
            local d = op:results()[1]
            assert.same(want[i], { d.allowed and 1 or 0, d.remaining, d.source })
            op:free()
        end
        -- The empty bucket is remembered: nothing to send.
        local op = lim:_op_start({ { "alice", 1 } }, true)
        assert.is_nil(op:request())
        assert.same({ false, 0, "cache" }, { op:results()[1].allowed, op:results()[1].remaining,
            op:results()[1].source })
        -- The C client sees the same bucket in Redis.
        local other = limiter { deny_cache = false }
        assert.same({ false, "redis" }, { other:peek("alice").allowed, other:peek("alice").source })
    end)

    it("encode a batch as one pipelined request, and an EVAL only after NOSCRIPT", function()
        -- The EVALSHA path (Redis 7 gets FCALL unless asked: functions_spec).
        local lim = limiter { capacity = 10, functions = false }
        local op = lim:_op_start({ { "a", 3 }, { "b", 11 }, { "a", 4 } }, true)
        local req = op:request()
        local _, n = req:gsub("EVALSHA", "")
        assert.equal(3, n)
        local head = "*8\r\n$7\r\nEVALSHA\r\n$40\r\n" .. core.script_sha1() .. "\r\n"
        assert.equal(head, req:sub(1, #head))
        local sent = drive(srv, op)
        assert.equal(2, sent)
        local ds = op:results()
        assert.same({ true, 7 }, { ds[1].allowed, ds[1].remaining })
        assert.same({ false, math.huge }, { ds[2].allowed, ds[2].retry_after })
        assert.same({ true, 3 }, { ds[3].allowed, ds[3].remaining })
        -- The script is cached now: one request of EVALSHA only.
        op = lim:_op_start({ { "c", 1 } }, false)
        assert.is_nil(op:request():find("EVAL\r\n", 1, true))
        assert.equal(1, drive(srv, op))
        assert.same({ true, 10, "redis" }, { op:results()[1].allowed, op:results()[1].remaining,
            op:results()[1].source })
    end)

    it("inject the time for the vectors", function()
        local lim = limiter { capacity = 5, rate = 1, deny_cache = false }
        local op = lim:_op_start({ { "k", 5 } }, true, 1000000)
        drive(srv, op)
        op = lim:_op_start({ { "k", 1 } }, true, 1250000)
        drive(srv, op)
        assert.same({ allowed = false, remaining = 0, limit = 5, retry_after = 0.75,
            reset_after = 4.75, source = "redis", time = 1.25 }, op:results()[1])
    end)

    it("let the policy decide a failed I/O, and open the breaker", function()
        local lim = limiter()
        local op = lim:_op_start({ { "k", 1 }, { "j", 0 } }, true)
        op:fail("ETIMEDOUT")
        assert.is_true(op:drop())
        local ds = op:results()
        assert.same({ false, "fail_closed", "ETIMEDOUT" }, { ds[1].allowed, ds[1].source,
            ds[1].error })
        assert.same({ true, "fail_closed" }, { ds[2].allowed, ds[2].source })   -- cost 0 passes
        assert.equal(1, lim:_stats().breaker_opens)
        -- The breaker is open: decided at once, nothing to send.
        op = lim:_op_start({ { "k", 1 } }, true)
        assert.is_nil(op:request())
        assert.is_false(op:drop())
        assert.same({ "fail_closed", "ETIMEDOUT" }, { op:results()[1].source,
            op:results()[1].error })
    end)

    it("treat a malformed reply as a failure and drop the connection", function()
        local lim = limiter { on_error = "open" }
        local op = lim:_op_start({ { "k", 1 } }, true)
        local state, used = op:feed("*8\r\n:1\r\n?what\r\n")
        assert.equal("done", state)
        assert.equal(0, used)
        assert.is_true(op:drop())
        local d = op:results()[1]
        assert.is_number(d.time)   -- this process' monotonic clock: the policy decided
        d.time = nil
        assert.same({ allowed = true, remaining = 2, limit = 3, retry_after = 0, reset_after = 0,
            source = "fail_open", error = "EPROTO" }, d)
    end)

    it("count an op freed before it is done as given up, never as a probe left waiting",
        function()
            local lim = limiter()
            local op = lim:_op_start({ { "k", 1 } }, true)
            op:fail("ECONNECT")   -- the breaker opens for 100 ms +-25%
            support.sleep(0.15)
            -- The breaker's one probe, abandoned (a Lua error, an aborted request).
            op = lim:_op_start({ { "k", 1 } }, true)
            assert.is_string(op:request())
            op:free()
            local r = op:results()[1]
            assert.same({ false, "ECLOSED" }, { r.allowed, r.error })
            -- Had the probe stayed pending, every later call would skip Redis for good;
            -- given up, it lets the very next call probe.
            op = lim:_op_start({ { "k", 1 } }, true)
            assert.is_string(op:request())
            drive(srv, op)
            assert.equal("redis", op:results()[1].source)
        end)

    it("let the garbage collector free a pending op, and its closed limiter after it", function()
        local live = support.settled_live()
        do
            local lim = limiter()
            local op = lim:_op_start({ { "k", 1 } }, true)
            assert.is_string(op:request())
            lim:close()
            -- The limiter is closed to callers, yet lives while the op needs it.
            assert.same({ n = 3, nil, "limiter is closed", "ECLOSED" }, pack(lim:allow("k")))
            assert.equal(live + 1, core._live())
            drive(srv, op)
            assert.equal("redis", op:results()[1].source)
            assert.equal(live, core._live())   -- freed when the op was done
            local op2 = limiter():_op_start({ { "k", 1 } }, true)
            assert.is_string(op2:request())
            -- LuaJIT keeps a dead local's stack slot, and marks it, until
            -- something else is written there: let go of all three explicitly.
            lim, op, op2 = nil, nil, nil
        end
        assert.equal(live, support.settled_live())
    end)

    it("open a connection with the core's handshake: AUTH, SELECT, PING", function()
        local pw = "op-s3cr3t"
        local auth = redis_server.start { "--requirepass", pw }
        local ok, err = pcall(function()
            local lim = hirate.new { url = "redis://:" .. pw .. "@127.0.0.1:" .. auth.port .. "/2",
                capacity = 3, rate = 1 }
            local hs = assert(lim:_handshake_start())
            local req = hs:request()
            assert.equal("*2\r\n$4\r\nAUTH\r\n$" .. #pw .. "\r\n" .. pw .. "\r\n"
                .. "*2\r\n$6\r\nSELECT\r\n$1\r\n2\r\n*1\r\n$4\r\nPING\r\n", req)
            -- One connection for the handshake and the call, as a cosocket.
            local op = lim:_op_start({ { "k", 1 } }, true)
            local replies = auth:relay(req .. op:request())
            assert.equal("+OK\r\n+OK\r\n+PONG\r\n", replies:sub(1, 17))
            assert.same({ "done", 17 }, { hs:feed(replies:sub(1, 17)) })
            assert.same(pack(true), pack(hs:result()))
            hs:free()
            local state = op:feed(replies:sub(18))
            if state == "send" then   -- NOSCRIPT on this fresh server
                state = op:feed(auth:relay(req .. op:request()):sub(18))
            end
            assert.equal("done", state)
            assert.same({ true, 2, "redis" }, { op:results()[1].allowed,
                op:results()[1].remaining, op:results()[1].source })
            assert.equal("1", auth:cli("-n", "2", "EXISTS", "rl:k"))

            -- A wrong password: the handshake's EAUTH fails the op that
            -- waited for the connection, under every policy.
            local wrong = hirate.new { url = "redis://:nope@127.0.0.1:" .. auth.port,
                capacity = 3, rate = 1, on_error = "open" }
            hs = assert(wrong:_handshake_start())
            assert.equal("done", hs:feed(auth:relay(hs:request())))
            local r = pack(hs:result())
            assert.same({ n = 3, nil, r[2], "EAUTH" }, r)
            assert.truthy(r[2]:find("WRONGPASS", 1, true), r[2])
            assert.is_nil(r[2]:find("nope", 1, true))
            hs:free()
            op = wrong:_op_start({ { "k", 1 } }, true)
            op:fail(r[3], r[2])
            assert.same({ allowed = false, error = "EAUTH", message = r[2] }, op:results()[1])
            -- The core's backoff: no new connection for now, with the same code.
            local none, msg, code = wrong:_handshake_start()
            assert.same({ nil, "EAUTH" }, { none, code })
            assert.truthy(msg:find("not reconnecting for", 1, true), msg)
        end)
        auth:close()
        assert(ok, err)
    end)

    it("send only a PING without a password or database", function()
        local hs = assert(limiter():_handshake_start())
        assert.equal("*1\r\n$4\r\nPING\r\n", hs:request())
        assert.equal("hirate.handshake(running)", tostring(hs))
        hs:free()
        hs:free()
        assert.equal("hirate.handshake(freed)", tostring(hs))
        support.raises("request: the handshake is freed", function() local _ = hs:request() end)
    end)

    it("ask for a probe when a failure looks like a TLS port", function()
        -- A plain connection closed without a byte at the first command.
        local lim = limiter()
        local hs = assert(lim:_handshake_start())
        assert.is_string(hs:request())
        assert.equal("probe", hs:fail("EIO", "closed"))
        assert.is_true(hs:probe_tls())
        assert.equal("*1\r\n$4\r\nPING\r\n", hs:request())
        assert.same({ "done", 7 }, { hs:feed("+PONG\r\n") })   -- Redis, over TLS
        local r = pack(hs:result())
        assert.same({ nil, "ETLS" }, { r[1], r[3] })
        assert.equal("127.0.0.1:" .. srv.port .. " closed the connection at the first command, "
            .. "and the port speaks TLS: use rediss://", r[2])
        hs:free()
    end)

    it("say where Redis is, in seconds", function()
        local lim = limiter { timeout = 0.05, connect_timeout = 1.5 }
        assert.same({ host = "127.0.0.1", port = srv.port, where = "127.0.0.1:" .. srv.port,
            connect_timeout = 1.5, timeout = 0.05, probe_timeout = 0.375, tls = false,
            tls_verify = false }, lim:_endpoint())
        lim = hirate.new { url = "redis://[::1]:7001", capacity = 1, rate = 1 }
        assert.same({ host = "::1", port = 7001, where = "[::1]:7001", connect_timeout = 0.25,
            timeout = 0.1, probe_timeout = 0.062, tls = false, tls_verify = false },
            lim:_endpoint())
        -- TLS: the probe's share comes out of the connect timeout.
        local dir = redis_server.certs()
        lim = hirate.new { url = "rediss://redis.internal:6380", capacity = 1, rate = 1,
            connect_timeout = 1, tls_ca_file = dir .. "/ca.crt",
            tls_cert_file = dir .. "/client.crt", tls_key_file = dir .. "/client.key" }
        assert.same({ host = "redis.internal", port = 6380, where = "redis.internal:6380",
            connect_timeout = 0.75, timeout = 0.1, probe_timeout = 0.25, tls = true,
            tls_verify = true, tls_server_name = "redis.internal",
            tls_ca_file = dir .. "/ca.crt", tls_cert_file = dir .. "/client.crt",
            tls_key_file = dir .. "/client.key" }, lim:_endpoint())
        lim = hirate.new { url = "rediss://10.0.0.5", capacity = 1, rate = 1,
            tls_server_name = "redis.internal", tls_verify = false }
        local ep = lim:_endpoint()
        assert.same({ "redis.internal", false }, { ep.tls_server_name, ep.tls_verify })
    end)

    it("reset a key as an op: forgotten locally at once, then the DEL", function()
        local lim = limiter()
        drive(srv, lim:_op_start({ { "k", 3 } }, true))
        assert.is_nil(lim:_op_start({ { "k", 1 } }, true):request())   -- the deny cache
        local op = assert(lim:_op_start_reset("k"))
        assert.equal("hirate.op(waiting, reset)", tostring(op))
        assert.is_string(lim:_op_start({ { "k", 1 } }, false):request())
        -- Redis still holds the bucket until the DEL is sent.
        assert.equal("1", srv:cli("EXISTS", "op:k"))
        assert.equal(1, drive(srv, op))
        assert.same(pack(true), pack(op:result()))
        assert.equal("0", srv:cli("EXISTS", "op:k"))
        support.raises("results: a reset op has one result (result())",
            function() local _ = op:results() end)
        -- A failed DEL: nil, message, code.
        op = lim:_op_start_reset("k")
        op:fail("ETIMEDOUT", "receive: timeout")
        local r = pack(op:result())
        assert.same({ nil, "ETIMEDOUT" }, { r[1], r[3] })
        assert.truthy(r[2]:find("timeout", 1, true), r[2])
        op:free()
    end)

    it("give the stats of the core", function()
        local lim = limiter { functions = false }
        drive(srv, lim:_op_start({ { "k", 1 } }, true))
        local s = lim:_stats()
        for _, f in ipairs { "connects", "evalsha", "eval", "conns_dropped", "cache_hits",
            "policy", "breaker_opens", "memory_keys", "local_keys", "cache_keys" } do
            assert.equal("number", type(s[f]), f)
        end
        -- The op path sends through the caller's connection, not the pool's
        -- (no connection counted); its calls are counted: the EVALSHA, and
        -- the EVAL after this flushed server's NOSCRIPT.
        assert.same({ 0, 1, 1 }, { s.connects, s.evalsha, s.eval })
    end)
end)
