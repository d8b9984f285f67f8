-- hirate.headers: a limiter's bands and decision handed to the core's
-- formatter (hirate.core.response, hirate_response_format), value for value
-- as the Python integrations send them. What is tested here is the
-- conversion: seconds back to the core's microseconds, sources, bands, the
-- names checked by the core. Runs under Lua 5.4 and LuaJIT
-- (tests/lua/nginx/run.sh).
local headers = require "hirate.headers"

local NEVER = math.huge
local ALL = headers.RATELIMIT + headers.LEGACY

local function decision(allowed, remaining, retry_after, reset_after, source)
    return { allowed = allowed, remaining = remaining, limit = 10, retry_after = retry_after,
             reset_after = reset_after, source = source or "redis" }
end

-- The response as a table: status, retry_after, then each header and the text.
local function response(limits, d, flags)
    local status, retry, policy, rl, xl, xr, xs, ra, text = headers.response(limits, d, flags)
    return { status = status, retry = retry, ["RateLimit-Policy"] = policy, RateLimit = rl,
             ["X-RateLimit-Limit"] = xl, ["X-RateLimit-Remaining"] = xr,
             ["X-RateLimit-Reset"] = xs, ["Retry-After"] = ra, text = text }
end

describe("hirate.headers", function()
    local one = headers.limits({ { capacity = 10, rate = 2, name = "10-per-5s" } })
    local P = '"10-per-5s";q=10;w=5'

    describe("one band", function()
        local cases = {
            { "an allowed request: t until full", decision(true, 9, 0, 0.5), ALL,
              { status = 200, ["RateLimit-Policy"] = P, RateLimit = '"10-per-5s";r=9;t=1',
                ["X-RateLimit-Limit"] = "10", ["X-RateLimit-Remaining"] = "9",
                ["X-RateLimit-Reset"] = "1" } },
            { "a whole number of seconds stays as it is", decision(true, 6, 0, 2),
              headers.RATELIMIT,
              { status = 200, ["RateLimit-Policy"] = P, RateLimit = '"10-per-5s";r=6;t=2' } },
            { "a microsecond more is a second more", decision(true, 6, 0, 2.000001),
              headers.RATELIMIT,
              { status = 200, ["RateLimit-Policy"] = P, RateLimit = '"10-per-5s";r=6;t=3' } },
            { "a refusal: t and Retry-After until it could pass",
              decision(false, 0, 0.25, 4.75), headers.RATELIMIT,
              { status = 429, retry = 1, ["RateLimit-Policy"] = P,
                RateLimit = '"10-per-5s";r=0;t=1', ["Retry-After"] = "1",
                text = "Too many requests; retry in 1 second." } },
            { "a request that can never pass: no t, no Retry-After",
              decision(false, 10, NEVER, 0), ALL,
              { status = 429, ["RateLimit-Policy"] = P, RateLimit = '"10-per-5s";r=10',
                ["X-RateLimit-Limit"] = "10", ["X-RateLimit-Remaining"] = "10",
                text = "Too many requests; this request exceeds the limit and can never pass." } },
            { "no header asked for: Retry-After still goes with a refusal",
              decision(false, 0, 2.5, 5), 0,
              { status = 429, retry = 3, ["Retry-After"] = "3",
                text = "Too many requests; retry in 3 seconds." } },
            { "on_error open: the policy, no RateLimit item, no legacy header",
              decision(true, 9, 0, 0, "fail_open"), ALL,
              { status = 200, ["RateLimit-Policy"] = P } },
            { "on_error closed: a 503, no RateLimit item",
              decision(false, 0, 0.1, 0.1, "fail_closed"), ALL,
              { status = 503, retry = 1, ["RateLimit-Policy"] = P, ["Retry-After"] = "1",
                text = "The rate limit cannot be checked now; retry in 1 second." } },
            { "the local bucket: its own figures", decision(true, 3, 0, 3.5, "local"),
              headers.RATELIMIT,
              { status = 200, ["RateLimit-Policy"] = P, RateLimit = '"10-per-5s";r=3;t=4' } },
        }
        for _, c in ipairs(cases) do
            it(c[1], function()
                assert.same(c[4], response(one, c[2], c[3]))
            end)
        end

        it("writes capacities up to 2^53-1 in full", function()
            local big = 9007199254740991
            local l = headers.limits({ { capacity = big, rate = 1e6, name = "x" } })
            local r = response(l, { allowed = true, remaining = big - 1, retry_after = 0,
                                    reset_after = 1, source = "redis" }, headers.RATELIMIT)
            assert.equal('"x";q=9007199254740991;w=9007199255', r["RateLimit-Policy"])
            assert.equal('"x";r=9007199254740990;t=1', r.RateLimit)
        end)
    end)

    describe("limits", function()
        it("names the one band as asked, quoted as a structured-field string", function()
            local l = headers.limits({ { capacity = 2, rate = 1, name = "2-per-2s" } },
                'a "b" \\c')
            assert.equal('"a \\"b\\" \\\\c";q=2;w=2',
                response(l, decision(true, 1, 0, 1), headers.RATELIMIT)["RateLimit-Policy"])
        end)
        local bad = { "", "caf\195\169", "tab\there", "new\nline" }
        for _, name in ipairs(bad) do
            it(("refuses %q, with the core's message"):format(name), function()
                local ok, err = pcall(headers.limits, { { capacity = 2, rate = 1, name = "b" } },
                    name)
                assert.is_false(ok)
                assert.truthy(tostring(err):find(("name %q: "):format(name)
                    .. (name == "" and "a band's name must be 1 to 64 bytes, got 0"
                    or "a band's name must be printable ASCII (it is sent in headers)"),
                    1, true))
            end)
        end
        it("refuses a name that is not a string", function()
            local ok, err = pcall(headers.limits, { { capacity = 2, rate = 1, name = "b" } }, 42)
            assert.is_false(ok)
            assert.truthy(tostring(err):find("name must be a string, got number", 1, true))
        end)
    end)

    describe("several bands", function()
        local two = headers.limits({ { capacity = 2, rate = 2, name = "burst" },
                                     { capacity = 1000, rate = 1000 / 86400, name = "daily" } })
        local function band(allowed, remaining, retry_after, reset_after)
            return { allowed = allowed, remaining = remaining, retry_after = retry_after,
                     reset_after = reset_after, source = "redis" }
        end

        it("lists one policy and one item per band, each its own figures", function()
            local d = { allowed = true, source = "redis", bands = {
                band(true, 1, 0, 0.5), band(true, 998, 0, 172.8) } }
            local r = response(two, d, headers.RATELIMIT)
            assert.equal('"burst";q=2;w=1, "daily";q=1000;w=86400', r["RateLimit-Policy"])
            assert.equal('"burst";r=1;t=1, "daily";r=998;t=173', r.RateLimit)
        end)

        it("a band that held the cost of a refusal says when it is full", function()
            local d = { allowed = false, source = "redis", bands = {
                band(false, 0, 0.25, 2), band(true, 998, 0, 172.8) } }
            local r = response(two, d, ALL)
            assert.equal('"burst";r=0;t=1, "daily";r=998;t=173', r.RateLimit)
            assert.equal("1", r["X-RateLimit-Reset"])
            assert.equal("Too many requests (burst); retry in 1 second.", r.text)
        end)

        it("a band that can never pass has no t, nor the response a Retry-After", function()
            local d = { allowed = false, source = "redis", bands = {
                band(false, 2, NEVER, 0), band(false, 1, 3, 10) } }
            local r = response(two, d, headers.RATELIMIT)
            assert.equal('"burst";r=2, "daily";r=1;t=3', r.RateLimit)
            assert.is_nil(r["Retry-After"])
            assert.equal("Too many requests (burst, daily); this request exceeds the limit and "
                .. "can never pass.", r.text)
        end)
    end)
end)
