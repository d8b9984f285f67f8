-- Several limits on one key ("bands", docs/semantics.md, "Several limits")
-- through the Lua API: hirate.new{limits = ...} as a limit string or a table
-- of bands, the decision's band (1-based) and bands (each band's own
-- figures, in the shape of a decision, with its name), lim:bands(), and the
-- errors, each word for word. The figures are worked out by hand below and
-- checked exactly, on the memory backend and on a real Redis (the time
-- injected with lim:_decide_at), for allow, peek and the blocking calls.
local hirate = require "hirate"
local support = require "helpers.support"
local redis_server = require "helpers.redis_server"

local raises = support.raises
local NEVER = math.huge

-- A decision or a band: allowed, remaining, limit, retry_after, reset_after
-- (seconds), band (1-based), at time t (seconds) from source.
local function fig(allowed, remaining, limit, retry_after, reset_after, band, source, t)
    return { allowed = allowed, remaining = remaining, limit = limit, retry_after = retry_after,
        reset_after = reset_after, band = band, source = source, time = t }
end

-- A burst of 2 refilled at 1 a second, and 4 refilled at a quarter a second:
-- rates whose arithmetic is exact in binary, so that every figure below is a
-- whole number of seconds or quarters.
local BANDS = { { capacity = 2, rate = 1, name = "burst" }, { capacity = 4, rate = 0.25,
    name = "daily" } }

-- { t (s), op, cost, whole {allowed, remaining, limit, retry, reset, band},
--   burst {...}, daily {...} } (each band's band is its own number)
local STEPS = {
    -- Both hold it: burst 1, daily 3; the fewest left is burst's; the
    -- longest until full is daily's (1 token at 0.25/s).
    { 0, "allow", 1, { true, 1, 2, 0, 4, 1 }, { true, 1, 2, 0, 1 }, { true, 3, 4, 0, 4 } },
    { 0, "allow", 1, { true, 0, 2, 0, 8, 1 }, { true, 0, 2, 0, 2 }, { true, 2, 4, 0, 8 } },
    -- burst is empty: refused, nothing spent; daily held the cost and says so.
    { 0, "allow", 1, { false, 0, 2, 1, 8, 1 }, { false, 0, 2, 1, 2 }, { true, 2, 4, 0, 8 } },
    -- At 2 s burst is full again and daily has 2.5: both spend 2; 0 and 0.5
    -- left are both 0 whole tokens, and the first of equals is burst.
    { 2, "allow", 2, { true, 0, 2, 0, 14, 1 }, { true, 0, 2, 0, 2 }, { true, 0, 4, 0, 14 } },
    -- At 4 s burst holds 2 but daily has 1: daily refuses, for 4 s.
    { 4, "allow", 2, { false, 1, 4, 4, 12, 2 }, { true, 2, 2, 0, 0 }, { false, 1, 4, 4, 12 } },
    -- 3 is above burst's capacity: never, which outwaits daily's 8 s.
    { 4, "allow", 3, { false, 1, 2, NEVER, 12, 1 }, { false, 2, 2, NEVER, 0 },
        { false, 1, 4, 8, 12 } },
    -- A peek says the cost would pass, and reports the bands as they are
    -- (daily has the fewest tokens); it spends nothing, so a second says
    -- the same, and the allow after them spends from the same state.
    { 4, "peek", 1, { true, 1, 4, 0, 12, 2 }, { true, 2, 2, 0, 0 }, { true, 1, 4, 0, 12 } },
    { 4, "peek", 1, { true, 1, 4, 0, 12, 2 }, { true, 2, 2, 0, 0 }, { true, 1, 4, 0, 12 } },
    { 4, "allow", 1, { true, 0, 4, 0, 16, 2 }, { true, 1, 2, 0, 1 }, { true, 0, 4, 0, 16 } },
    -- 3 s later burst is full and daily has 0.75: daily refuses for 1 s.
    { 7, "peek", 1, { false, 0, 4, 1, 13, 2 }, { true, 2, 2, 0, 0 }, { false, 0, 4, 1, 13 } },
}

local function wanted(step, source)
    local t = step[1]
    local w = step[4]
    local d = fig(w[1], w[2], w[3], w[4], w[5], w[6], source, t)
    d.bands = {}
    for i = 1, 2 do
        local b = step[4 + i]
        d.bands[i] = fig(b[1], b[2], b[3], b[4], b[5], i, source, t)
        d.bands[i].name = BANDS[i].name
    end
    return d
end

local function run_steps(opts, source)
    opts.limits = BANDS
    local lim = hirate.new(opts)
    for i, step in ipairs(STEPS) do
        local d = assert(lim:_decide_at("k", step[3], step[2] == "allow", step[1] * 1000000))
        assert.same(wanted(step, source), d, "step " .. i)
    end
    lim:close()
end

describe("bands", function()
    describe("each band's figures, exactly", function()
        it("on the memory backend", function()
            run_steps({}, "local")
        end)

        describe("on Redis", function()
            local srv
            setup(function()
                srv = redis_server.start()
            end)
            teardown(function()
                if srv then srv:close() end
            end)

            it("with the deny cache off", function()
                run_steps({ url = srv.url, prefix = "b0:", deny_cache = false, timeout = 5 },
                    "redis")
            end)

            it("one key holds every band, tokens and time of each", function()
                local lim = hirate.new { url = srv.url, prefix = "bk:", limits = BANDS,
                    timeout = 5 }
                assert(lim:_decide_at("k", 1, true, 1000000))
                assert.equal("1 1000000 3 1000000", srv:cli("GET", "bk:k"))
                assert.equal("1", srv:cli("EVAL", "return #redis.call('KEYS', 'bk:*')", "0"))
                lim:close()
            end)

            it("allow and peek give band figures from the blocking client too", function()
                local lim = hirate.new { url = srv.url, prefix = "bb:", timeout = 5,
                    limits = "2/second; 5/minute" }
                local d = assert(lim:allow("k", 2))
                assert.same({ true, 0, 1, 2 }, { d.allowed, d.remaining, d.band, #d.bands })
                assert.same({ "redis", "redis" }, { d.bands[1].source, d.bands[2].source })
                assert.same({ 0, 3 }, { d.bands[1].remaining, d.bands[2].remaining })
                assert.same({ 2, 5 }, { d.bands[1].limit, d.bands[2].limit })
                -- 4 is above burst's capacity: never, the longest wait.
                local p = assert(lim:peek("k", 4))
                assert.same({ false, 1 }, { p.allowed, p.band })
                assert.same({ false, false }, { p.bands[1].allowed, p.bands[2].allowed })
                assert.equal(NEVER, p.bands[1].retry_after) -- 4 > 2
                lim:close()
            end)
        end)
    end)

    describe("the limit", function()
        it("a limit string: one band a limit, named by the core", function()
            local lim = hirate.new { limits = "10/second; 1000/day" }
            assert.same({ { capacity = 10, rate = 10, name = "10-per-1s" },
                { capacity = 1000, rate = 1000 / 86400, name = "1000-per-86400s" } }, lim:bands())
            local d = lim:allow("k", 3)
            assert.same({ 7, 1, 10 }, { d.remaining, d.band, d.limit })
            assert.same({ "10-per-1s", "1000-per-86400s" }, { d.bands[1].name, d.bands[2].name })
            assert.same({ 7, 997 }, { d.bands[1].remaining, d.bands[2].remaining })
            lim:close()
        end)

        it("a table of bands and limit strings, in order", function()
            local lim = hirate.new { limits = { { capacity = 5, rate = 1, name = "burst" },
                "100/hour", "1000/day burst 50" } }
            assert.same({ { capacity = 5, rate = 1, name = "burst" },
                { capacity = 100, rate = 100 / 3600, name = "100-per-3600s" },
                { capacity = 50, rate = 1000 / 86400, name = "50-per-4320s" } }, lim:bands())
            lim:close()
        end)

        it("one band from limits still has band and bands; capacity and rate neither", function()
            local one = hirate.new { limits = "5/second" }
            local d = one:allow("k")
            assert.same({ 4, 1, 1 }, { d.remaining, d.band, #d.bands })
            assert.same({ "5-per-1s", 4 }, { d.bands[1].name, d.bands[1].remaining })
            one:close()
            -- Its one band is the whole: the decision is as it always was.
            local plain = hirate.new { capacity = 5, rate = 5 }
            d = plain:allow("k")
            assert.same({ allowed = true, remaining = 4, limit = 5, retry_after = 0,
                reset_after = 0.2, source = "local", time = d.time }, d)
            assert.same({ { capacity = 5, rate = 5, name = "5-per-1s" } }, plain:bands())
            plain:close()
        end)

        it("allow_many gives the whole's figures, as the core's batch does", function()
            local lim = hirate.new { limits = BANDS }
            local ds = lim:allow_many { { "a", 1 }, { "a", 2 } }
            assert.same({ true, 1, 1 }, { ds[1].allowed, ds[1].remaining, ds[1].band })
            assert.same({ false, 1 }, { ds[2].allowed, ds[2].band })
            assert.is_nil(ds[1].bands)
            lim:close()
        end)

        it("tostring shows each band", function()
            local lim = hirate.new { limits = BANDS }
            assert.equal('hirate.limiter(memory, bands: "burst" capacity=2 rate=1, "daily" '
                .. 'capacity=4 rate=0.25)', tostring(lim))
            lim:close()
            assert.equal('hirate.limiter(memory, bands: "burst" capacity=2 rate=1, "daily" '
                .. 'capacity=4 rate=0.25, closed)', tostring(lim))
            local one = hirate.new { limits = "100/minute" }
            assert.equal("hirate.limiter(memory, capacity=100, rate=1.6666666666666667)",
                tostring(one))
            one:close()
        end)

        it("bands() of a closed limiter is ECLOSED", function()
            local lim = hirate.new { limits = BANDS }
            lim:close()
            assert.same({ n = 3, nil, "limiter is closed", "ECLOSED" }, support.pack(lim:bands()))
        end)

        it("refill_seconds is the core's window", function()
            assert.same({ 5, 4000, 21, 86400, 0 }, { hirate.refill_seconds(10, 2),
                hirate.refill_seconds(4, 0.001), hirate.refill_seconds(7, 1 / 3),
                hirate.refill_seconds(1000, 1000 / 86400), hirate.refill_seconds(0, 1) })
            assert.equal(16, hirate.BANDS_MAX)
        end)
    end)

    describe("errors", function()
        local function new_error(opts, message)
            raises("bad argument #1 to 'new' (" .. message .. ")", function()
                local _ = hirate.new(opts)
            end)
        end
        local seventeen = {}
        for i = 1, 17 do
            seventeen[i] = { capacity = i, rate = 1 }
        end
        -- { what, limits, message }
        local cases = {
            { "not a string or a table", 5,
                'limits must be a limit string ("10/second; 1000/day") or a table of limits, '
                .. "got number" },
            { "an entry of another type", { true },
                "limits[1] must be a table {capacity =, rate =, name =} or a limit string, "
                .. "got boolean" },
            { "a table that is not an array", { { capacity = 1, rate = 1 }, x = 1 },
                "limits must be an array of limits ({capacity =, rate =, name =} or limit "
                .. "strings), or a limit string" },
            { "a band without a capacity", { { rate = 1 } }, "limits[1]: capacity is required" },
            { "a band without a rate", { "1/s", { capacity = 1 } },
                "limits[2]: rate is required" },
            { "a band's capacity of another type", { "1/s", { capacity = "10", rate = 1 } },
                "limits[2]: capacity must be an integer, got string" },
            { "a band's fractional capacity", { { capacity = 1.5, rate = 1 } },
                "limits[1]: capacity must be an integer, got 1.5" },
            { "a band's rate of another type", { { capacity = 1, rate = "1" } },
                "limits[1]: rate must be a number, got string" },
            { "a misspelt field", { { capacity = 1, rate = 1, nmae = "x" } },
                "limits[1]: unknown field 'nmae' (capacity, rate, name)" },
            { "a name of another type", { { capacity = 1, rate = 1, name = 5 } },
                "limits[1]: name must be a string, got number" },
            { "a name with a NUL byte", { { capacity = 1, rate = 1, name = "a\0b" } },
                "limits[1]: name contains a NUL byte" },
            { "a limit string that is not one", { "1/s", "100/fortnight" },
                "limits[2]: limit '100/fortnight': unknown unit 'fortnight' (second, minute, "
                .. "hour or day)" },
            { "a limit string with a NUL byte", "10/s\0x", "limits contains a NUL byte" },
            -- The core's words, with its band numbers as the entries of limits.
            { "a band's capacity of 0", { "1/s", { capacity = 0, rate = 1 } },
                "limits[2]: capacity must be a whole number from 1 to 2^53-1, got 0" },
            { "a band's rate of 0", { { capacity = 1, rate = 0 } },
                "limits[1]: rate must be a finite number of tokens per second above 0, got 0" },
            { "a band that takes 2^53 us to fill", { "1/s", "2/s", { capacity = 1000000000,
                rate = 0.1 } }, "limits[3]: capacity 1000000000 at rate 0.1 takes over 2^53 us "
                .. "to refill; raise the rate or lower the capacity" },
            { "two bands of one name", { { capacity = 1, rate = 1, name = "a" },
                { capacity = 2, rate = 1, name = "a" } },
                "limits[2]: limits[1] has the same name, 'a'" },
            { "two limit strings of one default name", { "1/s", "5/s", "1/s" },
                "limits[3]: limits[1] has the same name, '1-per-1s'" },
            { "an empty name", { { capacity = 1, rate = 1, name = "" } },
                "limits[1]: a band's name must be 1 to 64 bytes, got 0" },
            { "a name of 65 bytes", { { capacity = 1, rate = 1, name = ("x"):rep(65) } },
                "limits[1]: a band's name must be 1 to 64 bytes, got 65" },
            { "a name that is not printable ASCII", { { capacity = 1, rate = 1,
                name = "caf\195\169" } },
                "limits[1]: a band's name must be printable ASCII (it is sent in headers)" },
            { "17 bands", seventeen, "bands must be 1 to 16 bands, got 17" },
            { "no band at all", {}, "bands must be 1 to 16 bands, got 0" },
            { "a limit string that is not one", "100/fortnight",
                "limit '100/fortnight': unknown unit 'fortnight' (second, minute, hour or day)" },
            { "an empty limit string", "", "the limit string is empty" },
            { "two limits of one string that are the same", "1/s; 1/s",
                "limits: two limits are the same (1-per-1s)" },
        }
        for _, c in ipairs(cases) do
            it("raises for " .. c[1], function()
                new_error({ limits = c[2] }, c[3])
            end)
        end
        it("capacity and rate are required without limits", function()
            new_error({ rate = 1 }, "capacity is required (or limits)")
            new_error({ capacity = 1 }, "rate is required")
        end)
        it("limits with capacity or rate is one limit too many", function()
            new_error({ limits = "1/s", capacity = 5 },
                "set the limit once: capacity and rate, bands, or limits")
            new_error({ limits = { "1/s" }, capacity = 5, rate = 1 },
                "set the limit once: capacity and rate, bands, or limits")
        end)
    end)
end)
