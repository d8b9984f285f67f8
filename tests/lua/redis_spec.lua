-- The limiter against a real redis-server of the test's own: decisions,
-- batches, resets, the script cache, runtime errors (nil, message, code),
-- passwords, and each failure policy with Redis killed.
local hirate = require "hirate"
local core = require "hirate.core"
local support = require "helpers.support"
local redis_server = require "helpers.redis_server"

local pack = support.pack

-- A decision without its time (Redis' clock, or this process' monotonic
-- one), which a comparison with a whole table cannot know in advance.
local function untimed(d)
    assert.is_number(d.time)
    d.time = nil
    return d
end

describe("on Redis", function()
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
        local o = { url = srv.url, capacity = 5, rate = 0.001, timeout = 2, connect_timeout = 2 }
        for k, v in pairs(extra or {}) do
            o[k] = v
        end
        return hirate.new(o)
    end

    it("computes the script's SHA1 as Redis does", function()
        local f = assert(io.popen("redis-cli -p " .. srv.port .. " -x SCRIPT LOAD < "
            .. support.root .. "/lua/token_bucket.lua"))
        local sha = f:read("*a"):gsub("%s+$", "")
        f:close()
        assert.equal(sha, core.script_sha1())
    end)

    it("refunds tokens in Redis, capped at the capacity", function()
        local lim = limiter { prefix = "rf:" }
        local d = assert(lim:refund("fresh", 2))   -- a fresh key is full and stays so
        assert.same({ true, 5, 0, "redis" }, { d.allowed, d.remaining, d.reset_after, d.source })
        assert.equal("0", srv:cli("EXISTS", "rf:fresh"))
        assert.equal(0, lim:allow("k", 5).remaining)
        assert.is_false(lim:allow("k").allowed)
        d = assert(lim:refund("k", 2))
        assert.same({ true, 2, 0, "redis" }, { d.allowed, d.remaining, d.retry_after, d.source })
        local got = {}
        for i = 1, 3 do
            local a = lim:allow("k")
            got[i] = { a.allowed, a.remaining }
        end
        assert.same({ { true, 1 }, { true, 0 }, { false, 0 } }, got)
        assert.equal(5, lim:refund("k", 100).remaining)
        assert.equal(5, lim:refund("k").remaining)
        local err = support.error_of(function() lim:refund("k", -1) end)
        assert.truthy(err:find("cost must be", 1, true), err)
        lim:close()
    end)

    it("refunds under each failure policy with Redis gone", function()
        local dead = "redis://127.0.0.1:1"
        local lim = hirate.new { url = dead, capacity = 10, rate = 0.001, on_error = "local" }
        assert.equal(6, lim:allow("k", 4).remaining)
        local d = assert(lim:refund("k", 3))
        assert.same({ true, 9, "local", "ECONNECT" }, { d.allowed, d.remaining, d.source, d.error })
        lim:close()
        for _, policy in ipairs { "open", "closed" } do
            lim = hirate.new { url = dead, capacity = 10, rate = 0.001, on_error = policy }
            local none, msg, code = lim:refund("k")
            assert.is_nil(none)
            assert.equal("ECONNECT", code)
            assert.equal("the refund was not made: Redis failed (cannot connect to Redis) and "
                .. "on_error is '" .. policy .. "'", msg)
            lim:close()
        end
    end)

    it("spends from one bucket that Redis keeps", function()
        local lim = limiter { prefix = "t1:" }
        local want = { 4, 3, 2, 1, 0 }
        for i = 1, 5 do
            local d = lim:allow("alice")
            assert.is_true(d.allowed)
            assert.equal(want[i], d.remaining)
            assert.equal(5, d.limit)
            assert.equal(0, d.retry_after)
            assert.equal("redis", d.source)
            assert.is_nil(d.error)
        end
        -- Stored as Redis stores it, under the prefix, with a TTL.
        assert.truthy(srv:cli("GET", "t1:alice"):match("^%d"))
        assert.is_true(tonumber(srv:cli("PTTL", "t1:alice")) > 0)
        local d = lim:allow("alice")
        assert.is_false(d.allowed)
        assert.equal(0, d.remaining)
        -- 1 token at 0.001/s: 1000 s, less the time since the last spend.
        assert.is_true(d.retry_after > 999 and d.retry_after <= 1000, d.retry_after)
        -- Redis' reply to the last spend proved that the bucket lacks a token
        -- for 1000 s: the deny cache answers, with Redis' values.
        assert.equal("cache", d.source)
        -- A second limiter (another process, say) sees the same bucket.
        local other = limiter { prefix = "t1:", deny_cache = false }
        assert.is_false(other:peek("alice").allowed)
        assert.equal("redis", other:peek("alice").source)
    end)

    it("refuses a cost above the capacity forever, and spends nothing", function()
        local lim = limiter()
        local d = lim:allow("k", 6)
        assert.same({ allowed = false, remaining = 5, limit = 5, retry_after = math.huge,
            reset_after = 0, source = "redis" }, untimed(d))
        assert.equal(5, lim:peek("k").remaining)
    end)

    it("peeks without spending", function()
        local lim = limiter()
        assert.same({ allowed = true, remaining = 5, limit = 5, retry_after = 0, reset_after = 0,
            source = "redis" }, untimed(lim:peek("k", 5)))
        assert.equal(5, lim:peek("k").remaining)
        assert.equal("0", srv:cli("EXISTS", "rl:k"))
    end)

    it("resets a bucket to full", function()
        local lim = limiter()
        lim:allow("k", 5)
        assert.is_false(lim:allow("k").allowed)
        assert.same(pack(true), pack(lim:reset("k")))
        assert.equal("0", srv:cli("EXISTS", "rl:k"))
        assert.equal(4, lim:allow("k").remaining)
    end)

    it("decides a batch in one round trip, each item as alone", function()
        -- The EVALSHA path (Redis 7 gets FCALL unless asked: functions_spec).
        local lim = limiter { deny_cache = false, functions = false }
        local stats = lim:_stats()
        local ds = lim:allow_many { { "a", 2 }, { "b" }, { "a", 3 }, { "a", 1 }, { "c", 9 } }
        assert.equal(5, #ds)
        assert.same({ true, 3, "redis" }, { ds[1].allowed, ds[1].remaining, ds[1].source })
        assert.same({ true, 4 }, { ds[2].allowed, ds[2].remaining })
        assert.same({ true, 0 }, { ds[3].allowed, ds[3].remaining })
        assert.same({ false, 0 }, { ds[4].allowed, ds[4].remaining })
        assert.same({ false, 5, math.huge }, { ds[5].allowed, ds[5].remaining, ds[5].retry_after })
        local after = lim:_stats()
        -- One connection. The script cache is empty: five EVALSHA meet NOSCRIPT and
        -- go again, the first as EVAL, the other four as EVALSHA.
        assert.equal(1, after.connects - stats.connects)
        assert.equal(9, after.evalsha - stats.evalsha)
        assert.equal(1, after.eval - stats.eval)
        assert.same({}, lim:allow_many {})
    end)

    it("gives each failed item of a batch its own message", function()
        srv:cli("RPUSH", "rl:a list", "x")
        srv:cli("SET", "rl:not a bucket", "1 x")
        local ds = limiter():allow_many { { "a list" }, { "not a bucket" }, { "fine" } }
        assert.same({ false, "EREPLY" }, { ds[1].allowed, ds[1].error })
        assert.equal("Redis replied: WRONGTYPE ", ds[1].message:sub(1, 25))
        assert.same({ false, "EREPLY", "Redis replied: ERR hirate: bucket state is corrupt" },
            { ds[2].allowed, ds[2].error, ds[2].message })
        assert.same({ true, 4 }, { ds[3].allowed, ds[3].remaining })
    end)

    it("sends EVAL once after SCRIPT FLUSH, then EVALSHA again", function()
        local lim = limiter { functions = false }
        lim:allow("k")
        srv:cli("SCRIPT", "FLUSH")
        local before = lim:_stats()
        assert.equal(3, lim:allow("k").remaining)
        assert.equal(2, lim:allow("k").remaining)
        local after = lim:_stats()
        assert.equal(1, after.eval - before.eval)
        assert.equal(2, after.evalsha - before.evalsha)
    end)

    it("answers refusals from the deny cache without asking Redis", function()
        local lim = limiter()
        -- The reply shows the bucket empty: remembered, so nothing more goes to Redis.
        assert.equal(0, lim:allow("k", 5).remaining)
        local before = lim:_stats()
        for _ = 1, 10 do
            local d = lim:allow("k")
            assert.is_false(d.allowed)
            assert.equal("cache", d.source)
        end
        local after = lim:_stats()
        assert.same({ before.fcall, before.evalsha }, { after.fcall, after.evalsha })
        assert.equal(10, after.cache_hits - before.cache_hits)
        -- A reset forgets it.
        lim:reset("k")
        assert.same({ true, "redis" }, { lim:allow("k").allowed, lim:allow("k").source })
    end)

    it("talks to Redis over a unix socket", function()
        local lim = hirate.new { url = "unix://" .. srv.socket .. "?db=3", capacity = 2, rate = 1 }
        assert.equal("hirate.limiter(unix://" .. srv.socket .. "?db=3, capacity=2, rate=1)",
            tostring(lim))
        assert.equal("redis", lim:allow("k").source)
        assert.equal("1", srv:cli("-n", "3", "EXISTS", "rl:k"))
        assert.same({ path = srv.socket, where = srv.socket, connect_timeout = 0.25,
            timeout = 0.1, probe_timeout = 0.062, tls = false, tls_verify = false },
            lim:_endpoint())
    end)

    it("keeps keys apart by every byte", function()
        local lim = limiter()
        assert.equal(4, lim:allow("a\0b").remaining)
        assert.equal(4, lim:allow("a\0c").remaining)
        assert.equal(5, lim:peek("a").remaining)
        assert.equal(4, lim:allow("\r\n*1\r\n$4\r\nQUIT\r\n").remaining)
        assert.equal("PONG", srv:cli("PING"))
    end)
end)

describe("with a password", function()
    local canary = "s3cr3t-canary-7"
    local srv
    setup(function()
        srv = redis_server.start { "--requirepass", canary }
    end)
    teardown(function()
        if srv then srv:close() end
    end)

    it("authenticates with the URL's password", function()
        local lim = hirate.new { url = "redis://:" .. canary .. "@127.0.0.1:" .. srv.port,
            capacity = 3, rate = 1 }
        assert.equal("redis", lim:allow("k").source)
        assert.is_nil(tostring(lim):find(canary, 1, true))
    end)

    it("returns a wrong password as nil, message, 'EAUTH' without the password", function()
        local wrong = "wrong-" .. canary
        for _, policy in ipairs { "local", "open", "closed" } do
            local lim = hirate.new { url = "redis://app:" .. wrong .. "@127.0.0.1:" .. srv.port,
                capacity = 3, rate = 1, on_error = policy }
            -- allow_many: the error in the item's place.
            local item = lim:allow_many { { "k", 1 } }[1]
            assert.is_false(item.allowed)
            for _, r in ipairs { pack(lim:allow("k")), pack(lim:peek("k")),
                pack(nil, item.message, item.error), pack(lim:reset("k")) } do
                assert.equal(3, r.n)
                assert.is_nil(r[1])
                assert.equal("EAUTH", r[3])
                assert.equal("string", type(r[2]))
                assert.is_nil(r[2]:find(canary, 1, true), r[2])
                assert.is_nil(r[2]:find("wrong-", 1, true), r[2])
            end
            assert.is_nil(tostring(lim):find(canary, 1, true))
            assert.equal("hirate.limiter(redis://app:***@127.0.0.1:" .. srv.port
                .. ", capacity=3, rate=1)", tostring(lim))
        end
    end)

    it("returns a missing password as 'EAUTH'", function()
        local lim = hirate.new { url = srv.url, capacity = 3, rate = 1 }
        local r = pack(lim:allow("k"))
        assert.same({ n = 3, nil, r[2], "EAUTH" }, r)
        assert.truthy(r[2]:find("NOAUTH", 1, true), r[2])
    end)
end)

describe("when Redis is killed", function()
    local srv
    before_each(function()
        srv = redis_server.start()
    end)
    after_each(function()
        if srv then srv:close() end
    end)

    -- capacity 5, 1 token a second: decisions a few ms apart stay exact.
    local function limiter(policy)
        return hirate.new { url = srv.url, capacity = 5, rate = 1, on_error = policy,
            timeout = 0.5, connect_timeout = 0.5, prefix = policy .. ":" }
    end

    local expected = {
        ["local"] = { allowed = true, remaining = 4, limit = 5, retry_after = 0, reset_after = 1,
            source = "local", error = "ECONNECT" },
        open = { allowed = true, remaining = 4, limit = 5, retry_after = 0, reset_after = 0,
            source = "fail_open", error = "ECONNECT" },
    }

    for _, policy in ipairs { "local", "open", "closed" } do
        it("decides by on_error = '" .. policy .. "', then goes back to Redis", function()
            local lim = limiter(policy)
            assert.equal("redis", lim:allow("warm").source)   -- a pooled connection
            srv:kill()
            -- The pool sees that the server closed its idle connection, so the
            -- call goes to a new one, which is refused: ECONNECT.
            local t0 = support.now()
            local d = lim:allow("k")
            assert.is_true(support.now() - t0 < 0.5)
            if policy == "closed" then
                -- Refused until the breaker lets a probe through: 100 ms +-25%.
                assert.same({ false, 0, 5, "fail_closed", "ECONNECT" },
                    { d.allowed, d.remaining, d.limit, d.source, d.error })
                assert.is_true(d.retry_after > 0.07 and d.retry_after <= 0.125, d.retry_after)
                assert.equal(d.retry_after, d.reset_after)
            else
                assert.same(expected[policy], untimed(d))
            end
            assert.equal(1, lim:_stats().breaker_opens)
            -- The breaker is open: the next calls do not try Redis, but for one
            -- probe each backoff (at least 75 ms; under valgrind 100 calls may
            -- outlast one).
            local before, t1 = lim:_stats().connects, support.now()
            for _ = 1, 100 do
                local e = lim:allow("k", 0)
                assert.equal(expected[policy] and expected[policy].source or "fail_closed",
                    e.source)
                assert.equal("ECONNECT", e.error)
            end
            local probes = lim:_stats().connects - before
            assert.is_true(probes <= 1 + (support.now() - t1) / 0.075, probes)
            -- A cost above the capacity is never allowed, whatever the policy.
            d = lim:allow("k", 6)
            assert.same({ false, math.huge }, { d.allowed, d.retry_after })

            srv:restart()
            local back = false
            for _ = 1, 40 do   -- a probe within about 0.25 s; 2 s at most
                support.sleep(0.05)
                if lim:allow("probe").source == "redis" then
                    back = true
                    break
                end
            end
            assert.is_true(back, "the limiter did not go back to Redis")
            d = lim:allow("after")
            assert.same({ true, 4, "redis" }, { d.allowed, d.remaining, d.source })
            assert.is_nil(d.error)
        end)
    end

    it("makes a new limiter whose first call cannot connect decide by its policy", function()
        srv:kill()
        local lim = limiter("open")
        local d = lim:allow("k", 2)
        assert.same({ allowed = true, remaining = 3, limit = 5, retry_after = 0, reset_after = 0,
            source = "fail_open", error = "ECONNECT" }, untimed(d))
        -- reset has no policy: the failure is returned.
        local r = pack(lim:reset("k"))
        assert.equal(3, r.n)
        assert.is_nil(r[1])
        assert.equal("ECONNECT", r[3])
    end)

    it("answers within the timeout when Redis hangs (SIGSTOP)", function()
        local lim = hirate.new { url = srv.url, capacity = 5, rate = 1, on_error = "closed",
            timeout = 0.2, connect_timeout = 0.2 }
        assert.equal("redis", lim:allow("warm").source)
        srv:stop()
        local t0 = support.now()
        local d = lim:allow("k")
        local dt = support.now() - t0
        srv:cont()
        assert.same({ false, "fail_closed", "ETIMEDOUT" }, { d.allowed, d.source, d.error })
        assert.is_true(dt >= 0.15 and dt < 0.45, dt)
    end)
end)
