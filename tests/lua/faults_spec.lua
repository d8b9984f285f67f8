-- Spot checks of the fault matrix (tests/c/test_faults*.c has all of it)
-- from plain Lua, through the same core:
--
--   * Redis hangs (SIGSTOP): the call times out to the policy; it is not sent
--     again, and Redis may still run it (a timeout has an unknown outcome);
--   * Redis is killed: refused to the policy, then back on Redis by itself
--     after a restart (EVAL once: the new server has no script);
--   * a wrong password: nil, message, "EAUTH" under every policy, the
--     password in no message;
--   * malformed replies from a mock RESP server (tests/integration/
--     mock_resp.py, which answers the handshake's PING itself): a clean EPROTO (EIO when
--     it hangs up) and the policy, then Redis again once the replies are good.
local hirate = require "hirate"
local support = require "helpers.support"
local redis_server = require "helpers.redis_server"

local pack = support.pack
local source = { ["local"] = "local", open = "fail_open", closed = "fail_closed" }

local function limiter(url, policy, extra)
    local o = { url = url, capacity = 5, rate = 0.001, on_error = policy, timeout = 0.3,
        connect_timeout = 0.3 }
    for k, v in pairs(extra or {}) do
        o[k] = v
    end
    return hirate.new(o)
end

-- Calls (spending nothing) until Redis decides again: the breaker lets one
-- probe through after its backoff. Returns that decision.
local function until_redis(lim, key)
    local deadline = support.now() + 15
    repeat
        local d = lim:allow(key or "probe", 0)
        if d.source == "redis" then
            return d
        end
        support.sleep(0.02)
    until support.now() > deadline
    error("not back on Redis within 15 s")
end

describe("when Redis hangs (SIGSTOP)", function()
    local srv
    before_each(function() srv = redis_server.start() end)
    after_each(function() if srv then srv:close() end end)

    for _, policy in ipairs { "closed", "open" } do
        it("times out to on_error = '" .. policy .. "' and sends the call once", function()
            local lim = limiter(srv.url, policy)
            assert.equal("redis", lim:allow("warm").source)   -- a pooled connection
            srv:stop()
            local t0 = support.now()
            local ok, d = pcall(lim.allow, lim, "k", 2)
            local took = support.now() - t0
            srv:cont()
            assert(ok, d)
            assert.same({ policy == "open", source[policy], "ETIMEDOUT" },
                { d.allowed, d.source, d.error })
            assert.is_true(took >= 0.25 and took < 3, took)
            -- Redis read the call when it woke up, and ran it: spent once.
            assert.equal(3, until_redis(lim, "k").remaining)
            lim:close()
        end)
    end
end)

describe("when Redis is killed", function()
    local srv
    before_each(function() srv = redis_server.start() end)
    after_each(function() if srv then srv:close() end end)

    for _, policy in ipairs { "closed", "open", "local" } do
        it("is refused to on_error = '" .. policy .. "', then back after a restart", function()
            local lim = limiter(srv.url, policy)
            assert.equal(4, lim:allow("k").remaining)
            srv:kill()
            local t0 = support.now()
            local d = lim:allow("k")
            assert.is_true(support.now() - t0 < 1, "refused: no timeout to wait out")
            assert.equal(source[policy], d.source)
            assert.truthy(d.error == "ECONNECT" or d.error == "EIO", d.error)
            srv:restart()
            local loads = lim:_stats().function_loads
            until_redis(lim)
            d = lim:allow("k")
            assert.same({ "redis", 4 }, { d.source, d.remaining })
            assert.is_nil(d.error)
            -- The restarted server has no library: loaded again, once.
            assert.equal(1, lim:_stats().function_loads - loads)
            lim:close()
        end)
    end
end)

describe("with a wrong password", function()
    it("returns nil, message, 'EAUTH' under every policy, never the password", function()
        local canary = "Lua-sp0t-canary-53"
        local srv = redis_server.start { "--requirepass", "the-right-one" }
        local ok, err = pcall(function()
            for _, policy in ipairs { "local", "open", "closed" } do
                local lim = limiter("redis://:" .. canary .. "@127.0.0.1:" .. srv.port, policy)
                -- allow_many: the error in the item's place.
                local item = lim:allow_many { { "k", 1 } }[1]
                for _, r in ipairs { pack(lim:allow("k")), pack(lim:peek("k")),
                    pack(nil, item.message, item.error), pack(lim:reset("k")) } do
                    assert.equal(3, r.n)
                    assert.is_nil(r[1])
                    assert.equal("EAUTH", r[3])
                    assert.truthy(r[2]:find("WRONGPASS", 1, true), r[2])
                    assert.is_nil(r[2]:find(canary, 1, true), r[2])
                end
                assert.same({ false, nil }, { item.allowed, item.source })
                assert.is_nil(tostring(lim):find(canary, 1, true))
                lim:close()
            end
        end)
        srv:close()
        assert(ok, err)
    end)
end)

-- The mock server as our own child, killed with the test process.
local python = support.python

local function mock(script)
    local path = support.root .. "/tests/integration/mock_resp.py"
    local proc = assert(io.popen(("echo $$; exec setpriv --pdeathsig KILL %s -S '%s' %s")
        :format(python, path, script), "r"))
    local pid = proc:read("*l")
    local port = proc:read("*l")
    assert(port, "mock_resp.py did not start")
    return {
        url = "redis://127.0.0.1:" .. port,
        close = function()
            os.execute("kill -KILL " .. pid .. " 2>/dev/null")
            proc:close()
        end,
    }
end

describe("a malformed reply", function()
    local cases = {
        { "huge-array", "EPROTO" },   -- *4294967295: refused before any allocation
        { "neg-bulk", "EPROTO" },
        { "status", "EPROTO" },       -- +OK where the script's array belongs
        { "deep", "EPROTO" },         -- *1 nested 100000 times
        { "garbage", "EPROTO" },
        { "cut", "EIO" },             -- the connection closes mid-reply
    }
    for _, c in ipairs(cases) do
        for _, policy in ipairs { "closed", "open", "local" } do
            it(("(%s) is %s for on_error = '%s', then Redis again"):format(c[1], c[2], policy),
                function()
                    local server = mock(c[1] .. ",good")
                    local ok, err = pcall(function()
                        local lim = limiter(server.url, policy,
                            { timeout = 2, connect_timeout = 2 })
                        local d = lim:allow("k", 2)
                        assert.same({ policy ~= "closed", source[policy], c[2] },
                            { d.allowed, d.source, d.error })
                        -- The connection is dropped; good replies bring Redis back.
                        d = until_redis(lim, "k")
                        assert.same({ true, 4 }, { d.allowed, d.remaining })
                        assert.is_true(lim:_stats().conns_dropped >= 1)
                        lim:close()
                    end)
                    server.close()
                    assert(ok, err)
                end)
        end
    end

    it("is returned by reset as nil, message, 'EPROTO'", function()
        local server = mock("status")
        local ok, err = pcall(function()
            local lim = limiter(server.url, "local", { timeout = 2, connect_timeout = 2 })
            local r = pack(lim:reset("k"))
            assert.equal(3, r.n)
            assert.is_nil(r[1])
            assert.equal("EPROTO", r[3])
            assert.truthy(r[2]:find("^malformed reply from Redis"), r[2])
            lim:close()
        end)
        server.close()
        assert(ok, err)
    end)
end)
