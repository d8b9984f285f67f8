-- lim:stats(): the core's metrics (hirate_stats_get) as a Lua table, after
-- scripted sequences against a real redis-server, with exact counts; the
-- core's log lines of a real outage through the `log` option (one warning
-- when the breaker opens, one info when Redis answers again, never a
-- password); and deny_cache_max, the bound within which a reset made by
-- another limiter (another process) is seen.
local hirate = require "hirate"
local support = require "helpers.support"
local redis_server = require "helpers.redis_server"

local SOURCES = { "redis", "local", "cache", "fail_open", "fail_closed" }
local CODES = { "EINVAL", "ECAPACITY", "ERATE", "ECOST", "EKEY", "ERANGE", "EURL", "EOPTION",
    "ENOMEM", "ECONNECT", "ETIMEDOUT", "EIO", "EPROTO", "ESERVER", "EAUTH", "ENOPERM", "EREPLY",
    "ECLOSED", "ETLS", "EREFUSED", "ENOTREDIS" }

-- Every source and every code, 0 unless given.
local function decisions(t)
    local out = {}
    for _, s in ipairs(SOURCES) do
        out[s] = t[s] or 0
    end
    return out
end

local function errors(t)
    local out = {}
    for _, c in ipairs(CODES) do
        out[c] = t[c] or 0
    end
    return out
end

local function sum(list)
    local n = 0
    for _, v in ipairs(list) do
        n = n + v
    end
    return n
end

describe("lim:stats()", function()
    it("starts at zero, with the core's sources, codes and latency bounds in seconds", function()
        local lim = hirate.new { capacity = 1, rate = 1 }
        local s = lim:stats()
        assert.same(decisions {}, s.decisions)
        assert.same(errors {}, s.errors)
        assert.same({ 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
            0.25, 0.5, 1 }, s.latency.bounds)
        assert.same({ 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 }, s.latency.counts)
        for _, f in ipairs { "refused", "peeks", "breaker_opens", "breaker_closes", "connects",
            "conns_dropped", "latency_count", "latency_sum" } do
            assert.equal(0, s[f], f)
        end
        lim:close()
        assert.same({ nil, "limiter is closed", "ECLOSED" }, { lim:stats() })
    end)

    it("counts the memory backend's decisions, refusals and peeks, with no round trip", function()
        local lim = hirate.new { capacity = 3, rate = 0.001 }
        for _ = 1, 5 do
            lim:allow("k")
        end
        lim:peek("k")
        lim:allow_many { { "a", 1 }, { "b", 4 } }
        local s = lim:stats()
        assert.same(decisions { ["local"] = 7 }, s.decisions)
        assert.same({ 3, 1, 0 }, { s.refused, s.peeks, s.latency_count })
        assert.same(errors {}, s.errors)
        lim:close()
    end)

    it("counts a key or a cost the core refuses, as every front end's; not one of the wrong type",
        function()
            local lim = hirate.new { capacity = 3, rate = 0.001 }
            assert.has_error(function() lim:allow("") end, "bad argument #1 to 'allow' (key is empty)")
            assert.has_error(function() lim:peek(string.rep("k", 1025)) end)
            assert.has_error(function() lim:allow("k", -1) end,
                "bad argument #2 to 'allow' (cost must be a whole number from 0 to 2^53-1, got -1)")
            assert.has_error(function() lim:refund("k", -5) end)
            assert.has_error(function() lim:allow({}) end)
            assert.has_error(function() lim:allow("k", 1.5) end)
            assert.has_error(function() lim:allow("k", "2") end)
            local s = lim:stats()
            assert.same(errors { EKEY = 2, ECOST = 2 }, s.errors)
            assert.same(decisions {}, s.decisions)
            lim:close()
            assert.has_error(function() lim:allow("") end)   -- closed: raised, not counted
        end)
end)

describe("lim:stats() through Redis", function()
    local srv
    before_each(function() srv = redis_server.start { "--requirepass", "pw-canary-77" } end)
    after_each(function() if srv then srv:close() end end)

    it("is exact after allowed, refused, a peek, an outage of one breaker period and "
        .. "the recovery; the log has one warning and one info", function()
        local lines = {}
        local url = "redis://:pw-canary-77@127.0.0.1:" .. srv.port
        local lim = hirate.new { url = url, capacity = 10, rate = 0.001, deny_cache = false,
            on_error = "closed", timeout = 0.5, connect_timeout = 0.5,
            log = function(level, msg) lines[#lines + 1] = { level, msg } end }
        for i = 1, 15 do
            local d = lim:allow("k")
            assert.same({ i <= 10, "redis" }, { d.allowed, d.source })
        end
        assert.same({ true, "redis", 0 }, (function(d)
            return { d.allowed, d.source, d.remaining }
        end)(lim:peek("k", 0)))
        local before = lim:stats()
        assert.same(decisions { redis = 15 }, before.decisions)
        assert.same({ 5, 1, 0, 0 }, { before.refused, before.peeks, before.breaker_opens,
            before.breaker_closes })
        assert.same(errors {}, before.errors)
        assert.equal(1, before.connects)
        -- Round trips: the first FCALL finds no library and goes again
        -- with FUNCTION LOAD, then one each; the handshake is none.
        assert.same({ 17, 17 }, { before.latency_count, lim:_stats().fcall })
        assert.equal(17, sum(before.latency.counts))
        assert.same({}, lines)

        -- The outage: the first call fails (the pooled connection is dead: EIO,
        -- or ECONNECT when the core finds it closed before sending) and opens
        -- the breaker; the second is answered by the open breaker.
        srv:kill()
        local d1 = lim:allow("k")
        local d2 = lim:allow("k")
        assert.same({ false, "fail_closed" }, { d1.allowed, d1.source })
        assert.same({ false, "fail_closed" }, { d2.allowed, d2.source })
        local failed = d1.error
        assert.truthy(failed == "EIO" or failed == "ECONNECT", failed)
        local during = lim:stats()
        assert.same(decisions { redis = 15, fail_closed = 2 }, during.decisions)
        assert.same({ 7, 1, 0 }, { during.refused, during.breaker_opens, during.breaker_closes })
        local met = {}
        for _, d in ipairs { d1, d2 } do
            met[d.error] = (met[d.error] or 0) + 1
        end
        assert.same(errors(met), during.errors)
        assert.equal(1, #lines)
        assert.same({ "warning", "Redis at 127.0.0.1:" .. srv.port .. " failed (" }, {
            lines[1][1], lines[1][2]:sub(1, #("Redis at 127.0.0.1:" .. srv.port .. " failed ("))
        })
        assert.truthy(lines[1][2]:find("): the 'closed' policy decides until it answers again",
            1, true), lines[1][2])

        -- Back: peeks until the breaker's probe finds Redis again.
        srv:restart()
        local peeks, deadline = 0, support.now() + 15
        repeat
            local d = lim:peek("k", 0)
            peeks = peeks + 1
            if d.source == "redis" then
                break
            end
            assert.same({ "fail_closed" }, { d.source })
            support.sleep(0.02)
        until support.now() > deadline
        local s = lim:stats()
        assert.same(decisions { redis = 15, fail_closed = 2 }, s.decisions)
        assert.same({ 7, 1 + peeks, 1, 1 }, { s.refused, s.peeks, s.breaker_opens,
            s.breaker_closes })
        -- The first connection, the one after the restart, and with
        -- ECONNECT the refused attempt (an attempt counts).
        assert.equal(failed == "ECONNECT" and 3 or 2, s.connects, failed)
        -- The failed call made no round trip (it met no reply), the open
        -- breaker's none; the probe two, as the first call did (the
        -- restarted server has no library). Every one in a bucket.
        assert.same({ 19, 19 }, { s.latency_count, lim:_stats().fcall })
        assert.equal(19, sum(s.latency.counts))
        assert.is_true(s.latency_sum > 0)
        assert.equal(2, #lines, lines[2] and lines[2][2])
        assert.equal("info", lines[2][1])
        assert.truthy(lines[2][2]:match("^Redis at 127%.0%.0%.1:" .. srv.port
            .. " answers again, after %d+%.%d s$"), lines[2][2])
        for _, l in ipairs(lines) do
            assert.is_nil(l[2]:find("pw-canary-77", 1, true), l[2])
        end
        lim:close()
    end)
end)

describe("deny_cache_max", function()
    local srv
    before_each(function() srv = redis_server.start() end)
    after_each(function() if srv then srv:close() end end)

    it("lets a reset made by another limiter through within the bound", function()
        -- Two limiters, two deny caches: as two processes would have.
        local a = hirate.new { url = srv.url, capacity = 1, rate = 0.0001, deny_cache_max = 1 }
        local b = hirate.new { url = srv.url, capacity = 1, rate = 0.0001 }
        assert.is_true(a:allow("k").allowed)   -- it leaves 0: remembered
        local d = a:allow("k")
        assert.same({ false, "cache" }, { d.allowed, d.source })
        assert.is_true(b:reset("k"))
        -- Right after the reset A's cache still refuses (the reset is not
        -- heard of); within deny_cache_max it asks Redis again, and passes.
        d = a:allow("k")
        assert.same({ false, "cache" }, { d.allowed, d.source })
        local deadline = support.now() + 10
        repeat
            d = a:allow("k")
            if d.allowed then
                break
            end
            support.sleep(0.02)
        until support.now() > deadline
        assert.same({ true, "redis" }, { d.allowed, d.source })
        a:close()
        b:close()
    end)
end)

describe("hirate.metrics", function()
    local metrics = require "hirate.metrics"

    it("sums stats tables and renders them as Prometheus text, cumulative buckets", function()
        local a = hirate.new { capacity = 2, rate = 0.001 }
        local b = hirate.new { capacity = 2, rate = 0.001 }
        for _ = 1, 3 do
            a:allow("k")
        end
        b:peek("k")
        local s = metrics.sum(metrics.sum(nil, a:stats()), b:stats())
        assert.same(decisions { ["local"] = 3 }, s.decisions)
        assert.same({ 1, 1 }, { s.refused, s.peeks })
        s.latency.counts[2], s.latency.counts[14] = 2, 1
        s.latency_count, s.latency_sum = 3, 1.5
        s.errors.ETIMEDOUT = 4
        local text = metrics.render { ['we"b'] = s }
        local lines = {}
        for l in text:gmatch("[^\n]+") do
            lines[l] = true
        end
        for _, want in ipairs {
            'hirate_decisions_total{limiter="we\\"b",source="local"} 3',
            'hirate_decisions_total{limiter="we\\"b",source="redis"} 0',
            'hirate_refused_total{limiter="we\\"b"} 1',
            'hirate_peeks_total{limiter="we\\"b"} 1',
            'hirate_errors_total{limiter="we\\"b",code="ETIMEDOUT"} 4',
            'hirate_errors_total{limiter="we\\"b",code="EKEY"} 0',
            'hirate_breaker_opens_total{limiter="we\\"b"} 0',
            'hirate_redis_round_trip_seconds_bucket{limiter="we\\"b",le="0.0001"} 0',
            'hirate_redis_round_trip_seconds_bucket{limiter="we\\"b",le="0.00025"} 2',
            'hirate_redis_round_trip_seconds_bucket{limiter="we\\"b",le="1"} 2',
            'hirate_redis_round_trip_seconds_bucket{limiter="we\\"b",le="+Inf"} 3',
            'hirate_redis_round_trip_seconds_sum{limiter="we\\"b"} 1.5',
            'hirate_redis_round_trip_seconds_count{limiter="we\\"b"} 3',
            "# TYPE hirate_redis_round_trip_seconds histogram",
        } do
            assert.is_true(lines[want], want)
        end
        -- A worker's copy reads back as the table it was made of.
        assert.same(s, metrics._decode(metrics._encode(s)))
        a:close()
        b:close()
    end)
end)
