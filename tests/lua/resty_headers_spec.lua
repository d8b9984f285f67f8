-- hirate.headers: the RateLimit headers of a decision, value for value as the
-- Python package (bindings/python/hirate/_http.py) writes them, one item per
-- band for a limiter of several. Runs under Lua 5.4 and LuaJIT
-- (tests/lua/nginx/run.sh); w is the core's (hirate.core).
local headers = require "hirate.headers"

local NEVER = math.huge

local function decision(allowed, remaining, retry_after, reset_after, source)
    return { allowed = allowed, remaining = remaining, limit = 10, retry_after = retry_after,
             reset_after = reset_after, source = source or "redis" }
end

describe("hirate.headers", function()
    describe("window: seconds to refill an empty bucket, rounded up", function()
        -- capacity, rate, w: the core's reset_after from 0 tokens, rounded up
        -- (hirate_refill_seconds, which window is).
        local cases = {
            { 10, 2, 5 }, { 2, 0.5, 4 }, { 4, 0.001, 4000 }, { 1, 1, 1 },
            { 3, 0.1, 30 },                       -- 3 / 0.1 is 29.999999999999996
            { 10, 3, 4 }, { 7, 1 / 3, 21 }, { 1000000, 1e6, 1 }, { 1, 1e6, 1 },
            { 9007199254, 1, 9007199254 },        -- near 2^53 us: the ceiling stays exact
        }
        for _, c in ipairs(cases) do
            it(("capacity %s at rate %.17g is %s s"):format(c[1], c[2], c[3]), function()
                assert.equal(c[3], headers.window(c[1], c[2]))
            end)
        end
    end)

    it("is the core's hirate_refill_seconds", function()
        assert.equal(require("hirate.core").refill_seconds, headers.window)
    end)

    describe("quote", function()
        it("quotes a name as a structured-field string", function()
            assert.equal('"api"', headers.quote("api"))
            assert.equal('"a \\"b\\" \\\\c"', headers.quote('a "b" \\c'))
        end)
        local bad = { "", "caf\195\169", "tab\there", "new\nline", 42 }
        for _, name in ipairs(bad) do
            it("refuses " .. (type(name) == "string" and ("%q"):format(name) or type(name)),
                function()
                    local ok, err = pcall(headers.quote, name)
                    assert.is_false(ok)
                    assert.truthy(tostring(err):find("name must be 1 or more printable ASCII "
                        .. "characters (it is sent in the RateLimit headers), got ", 1, true))
                end)
        end
    end)

    describe("build", function()
        local q = headers.quote("10-per-5s")
        local P = '"10-per-5s";q=10;w=5'
        -- decision, legacy, the headers
        local cases = {
            { "an allowed request: t until full",
              decision(true, 9, 0, 0.5), false,
              { ["RateLimit-Policy"] = P, RateLimit = '"10-per-5s";r=9;t=1' } },
            { "a whole number of seconds stays as it is",
              decision(true, 6, 0, 2), false,
              { ["RateLimit-Policy"] = P, RateLimit = '"10-per-5s";r=6;t=2' } },
            { "a microsecond more is a second more",
              decision(true, 6, 0, 2.000001), false,
              { ["RateLimit-Policy"] = P, RateLimit = '"10-per-5s";r=6;t=3' } },
            { "a refusal: t and Retry-After until it could pass",
              decision(false, 0, 0.25, 4.75), false,
              { ["RateLimit-Policy"] = P, RateLimit = '"10-per-5s";r=0;t=1',
                ["Retry-After"] = "1" } },
            { "a request that can never pass: no t, no Retry-After",
              decision(false, 10, NEVER, 0), false,
              { ["RateLimit-Policy"] = P, RateLimit = '"10-per-5s";r=10' } },
            { "legacy headers carry the same t",
              decision(false, 0, 2.5, 5), true,
              { ["RateLimit-Policy"] = P, RateLimit = '"10-per-5s";r=0;t=3',
                ["Retry-After"] = "3", ["X-RateLimit-Limit"] = "10",
                ["X-RateLimit-Remaining"] = "0", ["X-RateLimit-Reset"] = "3" } },
            { "legacy without a time: no X-RateLimit-Reset",
              decision(false, 10, NEVER, 0), true,
              { ["RateLimit-Policy"] = P, RateLimit = '"10-per-5s";r=10',
                ["X-RateLimit-Limit"] = "10", ["X-RateLimit-Remaining"] = "10" } },
        }
        for _, c in ipairs(cases) do
            it(c[1], function()
                assert.same(c[4], headers.build(c[2], q, 10, 5, c[3]))
            end)
        end

        it("clears what a reused table held for another decision", function()
            local out = headers.build(decision(false, 0, 2.5, 5), q, 10, 5, true)
            headers.build(decision(true, 9, 0, 0.5), q, 10, 5, false, out)
            assert.is_nil(out["Retry-After"])
            assert.equal('"10-per-5s";r=9;t=1', out.RateLimit)
        end)

        it("writes capacities up to 2^53-1 in full", function()
            local big = 9007199254740991
            local out = headers.build({ allowed = true, remaining = big - 1, retry_after = 0,
                                        reset_after = 1 }, '"x"', big, 9007199254, false)
            assert.equal('"x";q=9007199254740991;w=9007199254', out["RateLimit-Policy"])
            assert.equal('"x";r=9007199254740990;t=1', out.RateLimit)
        end)
    end)

    describe("several bands", function()
        local quoted = { headers.quote("burst"), headers.quote("daily") }
        local bands = { { capacity = 2 }, { capacity = 1000 } }
        local function band(allowed, remaining, retry_after, reset_after, name)
            return { allowed = allowed, remaining = remaining, retry_after = retry_after,
                     reset_after = reset_after, name = name }
        end

        it("lists one policy per band, in order", function()
            assert.equal('"burst";q=2;w=1, "daily";q=1000;w=86400',
                headers.policies(quoted, bands, { 1, 86400 }))
        end)

        it("gives each band's remaining and t", function()
            local d = { allowed = true, bands = { band(true, 1, 0, 0.5, "burst"),
                band(true, 998, 0, 172.8, "daily") } }
            assert.equal('"burst";r=1;t=1, "daily";r=998;t=173', headers.items(d, quoted))
        end)

        it("a band that held the cost of a refusal says when it is full", function()
            local d = { allowed = false, bands = { band(false, 0, 0.25, 2, "burst"),
                band(true, 998, 0, 172.8, "daily") } }
            assert.equal('"burst";r=0;t=1, "daily";r=998;t=173', headers.items(d, quoted))
            assert.same({ "burst" }, headers.refused(d))
        end)

        it("a band that can never pass has no t", function()
            local d = { allowed = false, bands = { band(false, 2, NEVER, 0, "burst"),
                band(false, 1, 3, 10, "daily") } }
            assert.equal('"burst";r=2, "daily";r=1;t=3', headers.items(d, quoted))
            assert.same({ "burst", "daily" }, headers.refused(d))
        end)
    end)

    describe("refusal_text", function()
        local cases = {
            { decision(false, 0, 0.4, 5), "Too many requests; retry in 1 second.\n" },
            { decision(false, 0, 2.5, 5), "Too many requests; retry in 3 seconds.\n" },
            { decision(false, 3, NEVER, 0),
              "Too many requests; this request exceeds the limit and can never pass.\n" },
            { decision(false, 0, 0.1, 0.1, "fail_closed"),
              "The rate limit cannot be checked now; retry in 1 second.\n" },
            -- Several bands: the ones that refused, by name.
            { { allowed = false, remaining = 0, retry_after = 0.5, source = "redis",
                bands = { { allowed = false, name = "burst" }, { allowed = true, name = "day" } } },
              "Too many requests (burst); retry in 1 second.\n" },
            { { allowed = false, remaining = 0, retry_after = 30, source = "cache",
                bands = { { allowed = false, name = "burst" }, { allowed = false, name = "day" } } },
              "Too many requests (burst, day); retry in 30 seconds.\n" },
            { { allowed = false, remaining = 0, retry_after = 1, source = "fail_closed",
                bands = { { allowed = false, name = "burst" }, { allowed = false, name = "day" } } },
              "The rate limit cannot be checked now; retry in 1 second.\n" },
        }
        for _, c in ipairs(cases) do
            it(("says %q"):format(c[2]), function()
                assert.equal(c[2], headers.refusal_text(c[1]))
            end)
        end
    end)
end)
