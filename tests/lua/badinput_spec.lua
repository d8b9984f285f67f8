-- The bad-input sweep through the Lua API, table-driven:
--
--   * every number option (capacity, rate, timeout, connect_timeout) and
--     every cost at NaN, +-inf, negative, zero, 1e308 and 2^53 (as an
--     integer and as a float), and of wrong types: each raises naming the
--     argument and the rule, or is accepted when the rules accept it (a rate
--     of 1e308, a cost of 0). Lua 5.3 and later have integers, so a float
--     there is "not an integer"; Lua 5.1 and LuaJIT only have doubles, so a
--     whole one is checked for range instead;
--   * keys that are empty, 1 MiB long or not strings: raised by allow, peek,
--     reset and allow_many alike, on a memory and a Redis limiter, and
--     nothing spent;
--   * keys that are valid although they look dangerous (NUL, CRLF, cluster
--     hash tags, printf directives, bytes that are not UTF-8): each stored
--     byte for byte under the prefix in Redis, in a bucket of its own.
local hirate = require "hirate"
local support = require "helpers.support"
local redis_server = require "helpers.redis_server"

local raises = support.raises
local lua54 = _VERSION == "Lua 5.4" or _VERSION == "Lua 5.3"
local nan, inf = 0 / 0, math.huge
local MIB = 1024 * 1024
-- 2^53 as an integer where Lua has integers, and as a float everywhere.
local two53 = lua54 and math.tointeger(2 ^ 53) or 2 ^ 53
local two53f = 2 ^ 53

-- The message on Lua 5.3/5.4, or on 5.1/LuaJIT.
local function by_version(m54, m51)
    return lua54 and m54 or m51
end

local CAP = "capacity must be a whole number from 1 to 2^53-1, got "
local RATE = "rate must be a finite number of tokens per second above 0, got "
local COST = "cost must be a whole number from 0 to 2^53-1, got "

-- { option, value, what a test name shows, the message inside "bad argument #1 to 'new' (...)" }
local bad_options = {
    { "capacity", nan, "NaN", by_version("capacity must be an integer, got -nan",
        "capacity must be an integer, got -nan") },
    { "capacity", inf, "inf", by_version("capacity must be an integer, got inf", CAP .. "inf") },
    { "capacity", -inf, "-inf", by_version("capacity must be an integer, got -inf",
        CAP .. "-inf") },
    { "capacity", -1, "-1", CAP .. "-1" },
    { "capacity", 0, "0", CAP .. "0" },
    { "capacity", 1e308, "1e308", by_version("capacity must be an integer, got 1e+308",
        CAP .. "1e+308") },
    { "capacity", two53, "2^53", CAP .. "9007199254740992" },
    { "capacity", two53f, "2^53 as a float", by_version(
        "capacity must be an integer, got 9007199254740992.0", CAP .. "9007199254740992") },
    { "capacity", "10", "a string", "capacity must be an integer, got string" },
    { "capacity", true, "a boolean", "capacity must be an integer, got boolean" },
    { "capacity", {}, "a table", "capacity must be an integer, got table" },
    { "rate", nan, "NaN", RATE .. "-nan" },
    { "rate", inf, "inf", RATE .. "inf" },
    { "rate", -inf, "-inf", RATE .. "-inf" },
    { "rate", -1, "-1", RATE .. "-1" },
    { "rate", 0, "0", RATE .. "0" },
    -- computed: Lua 5.1 folds the constant -0.0 to +0
    { "rate", -1 / math.huge, "-0", RATE .. "-0" },
    { "rate", -1e308, "-1e308", RATE .. "-1e+308" },
    { "rate", 1e-308, "1e-308", "capacity 10 at rate 1e-308 takes over 2^53 us to refill; "
        .. "raise the rate or lower the capacity" },
    { "rate", "1", "a string", "rate must be a number, got string" },
    { "rate", false, "a boolean", "rate must be a number, got boolean" },
}
for _, name in ipairs { "timeout", "connect_timeout" } do
    local range = name .. " must be from 0.001 to 60 seconds, got "
    for _, c in ipairs {
        { nan, "NaN", range .. "-nan" },
        { inf, "inf", range .. "inf" },
        { -inf, "-inf", range .. "-inf" },
        { -1, "-1", range .. "-1" },
        { 0, "0", range .. "0" },
        { 1e308, "1e308", range .. "1e+308" },
        { two53f, "2^53", range .. "9007199254740992" },
        { "0.1s0", "a string that is not a duration", name .. ': "0.1s0" is not a duration (a number and a unit: 250us, 100ms, 0.25s, 2m, 1h; a number alone is seconds)' },
        { true, "a boolean", name
            .. ' must be a number of seconds or a string with a unit ("100ms"), got boolean' },
    } do
        bad_options[#bad_options + 1] = { name, c[1], c[2], c[3] }
    end
end

describe("hirate.new with a bad number", function()
    for _, c in ipairs(bad_options) do
        it(("raises naming %s = %s"):format(c[1], c[3]), function()
            local o = { url = "redis://127.0.0.1:1", capacity = 10, rate = 1 }
            o[c[1]] = c[2]
            raises("bad argument #1 to 'new' (" .. c[4] .. ")", function()
                local _ = hirate.new(o)
            end)
        end)
    end

    it("accepts the huge finite rates, which refill within a microsecond", function()
        for _, rate in ipairs { 1e308, two53f } do
            local lim = hirate.new { capacity = 5, rate = rate }
            assert.equal(0, lim:_decide_at("k", 5, true, 1000).remaining)
            local d = lim:_decide_at("k", 1, true, 1000)
            assert.same({ false, 1e-6, 1e-6 }, { d.allowed, d.retry_after, d.reset_after })
            assert.is_true(lim:_decide_at("k", 5, true, 1001).allowed)
            lim:close()
        end
    end)
end)

-- { key, what a test name shows, the message for argument #1 }
local bad_keys = {
    { "", "an empty key", "key is empty" },
    { ("k"):rep(513), "a key of 513 bytes", "key is 513 bytes; the most is 512" },
    { ("k"):rep(MIB), "a key of 1 MiB", "key is 1048576 bytes; the most is 512" },
    { ("\0"):rep(MIB), "1 MiB of NUL", "key is 1048576 bytes; the most is 512" },
    { 42, "a number", "key must be a string, got number" },
    { nan, "NaN", "key must be a string, got number" },
    { true, "a boolean", "key must be a string, got boolean" },
    { {}, "a table", "key must be a string, got table" },
}

-- { cost, what a test name shows, the message for argument #2 }
local bad_costs = {
    { nan, "NaN", "cost must be an integer, got -nan" },
    { inf, "inf", by_version("cost must be an integer, got inf", COST .. "inf") },
    { -inf, "-inf", by_version("cost must be an integer, got -inf", COST .. "-inf") },
    { -1, "-1", COST .. "-1" },
    { 1e308, "1e308", by_version("cost must be an integer, got 1e+308", COST .. "1e+308") },
    { two53, "2^53", COST .. "9007199254740992" },
    { two53f, "2^53 as a float", by_version("cost must be an integer, got 9007199254740992.0",
        COST .. "9007199254740992") },
    { 1.5, "1.5", "cost must be an integer, got 1.5" },
    { "1", "a string", "cost must be an integer, got string" },
    { true, "a boolean", "cost must be an integer, got boolean" },
}

-- Every call that takes the bad argument, each raising its message.
local function check_calls(lim, key, cost, message)
    local arg = cost == 1 and "#1" or "#2"
    raises(("bad argument %s to 'allow' (%s)"):format(arg, message),
        function() local _ = lim:allow(key, cost) end)
    raises(("bad argument %s to 'peek' (%s)"):format(arg, message),
        function() local _ = lim:peek(key, cost) end)
    raises(("bad argument #1 to 'allow_many' (item 2: %s)"):format(message),
        function() local _ = lim:allow_many { { "fine", 1 }, { key, cost } } end)
    if cost == 1 then
        raises(("bad argument #1 to 'reset' (%s)"):format(message),
            function() local _ = lim:reset(key) end)
    end
    -- allow_many checks every item before it decides any: nothing spent.
    assert.equal(5, lim:peek("fine").remaining)
    assert.equal(5, lim:peek("k").remaining)
end

local function sweep(make)
    for _, c in ipairs(bad_keys) do
        it("raises for " .. c[2] .. " and spends nothing", function()
            check_calls(make(), c[1], 1, c[3])
        end)
    end
    for _, c in ipairs(bad_costs) do
        it("raises for a cost of " .. c[2] .. " and spends nothing", function()
            check_calls(make(), "k", c[1], c[3])
        end)
    end
    it("decides a cost of 0 and one above the capacity; neither is an error", function()
        local lim = make()
        local d = lim:allow("k", 0)
        assert.same({ true, 5, 0 }, { d.allowed, d.remaining, d.retry_after })
        d = lim:allow("k", math.tointeger and math.tointeger(2 ^ 53 - 1) or 2 ^ 53 - 1)
        assert.same({ false, 5, math.huge }, { d.allowed, d.remaining, d.retry_after })
    end)
end

describe("bad calls on the memory backend", function()
    sweep(function() return hirate.new { capacity = 5, rate = 0.001 } end)
end)

describe("hirate.key_error and hirate.cost_error", function()
    it("give the message a call raises, named as asked, and nil for what a call takes", function()
        for _, c in ipairs(bad_keys) do
            assert.equal(c[3], hirate.key_error(c[1]))
            assert.equal("item 2: " .. c[3], hirate.key_error(c[1], "item 2: key"))
        end
        for _, c in ipairs(bad_costs) do
            assert.equal(c[3], hirate.cost_error(c[1]))
            assert.equal("item 2: " .. c[3], hirate.cost_error(c[1], "item 2: cost"))
        end
        assert.same({ nil, nil }, { hirate.key_error("k"), hirate.key_error(("k"):rep(512)) })
        assert.same({ nil, nil, nil }, { hirate.cost_error(nil), hirate.cost_error(0),
            hirate.cost_error(math.tointeger and math.tointeger(2 ^ 53 - 1) or 2 ^ 53 - 1) })
    end)
end)

describe("bad calls on the Redis backend", function()
    local srv
    setup(function() srv = redis_server.start() end)
    teardown(function() if srv then srv:close() end end)
    before_each(function() srv:cli("FLUSHALL") end)
    sweep(function()
        return hirate.new { url = srv.url, capacity = 5, rate = 0.001, on_error = "closed",
            timeout = 5, connect_timeout = 5 }
    end)
end)

-- Valid keys (keys are bytes).
local odd_keys = {
    { "NUL inside", "a\0b" },
    { "NUL inside, another byte after it", "a\0c" },
    { "the bytes before that NUL", "a" },
    { "a lone NUL", "\0" },
    { "CRLF", "a\r\nb" },
    { "a RESP command after CRLF", "x\r\n*1\r\n$8\r\nFLUSHALL\r\n" },
    { "a cluster hash tag", "{user1}:a" },
    { "the same hash tag, another key", "{user1}:b" },
    { "empty braces", "{}" },
    { "printf directives", "%s%n%p%b" },
    { "bytes that are not UTF-8", "\255\254\253" },
    { "an overlong NUL", "\192\128" },
    { "512 bytes", ("\255"):rep(512) },
}

-- A Redis command as RESP, for keys that no shell argument can hold.
local function resp(...)
    local out = { "*" .. select("#", ...) .. "\r\n" }
    for _, a in ipairs { ... } do
        out[#out + 1] = "$" .. #a .. "\r\n" .. a .. "\r\n"
    end
    return table.concat(out)
end

describe("keys that look dangerous", function()
    it("have buckets of their own in memory", function()
        local lim = hirate.new { capacity = 5, rate = 0.001 }
        for _, k in ipairs(odd_keys) do
            assert.equal(4, lim:allow(k[2]).remaining, k[1])
        end
        for _, k in ipairs(odd_keys) do
            assert.equal(4, lim:peek(k[2]).remaining, k[1])
        end
        assert.equal(#odd_keys, lim:_stats().memory_keys)
    end)

    it("are stored byte for byte under the prefix in Redis, one bucket each", function()
        local srv = redis_server.start()
        local ok, err = pcall(function()
            local prefix = "{lua}\r\n:"
            local lim = hirate.new { url = srv.url, prefix = prefix, capacity = 5, rate = 0.001,
                on_error = "closed", timeout = 5, connect_timeout = 5 }
            local exists = {}
            for _, k in ipairs(odd_keys) do
                local d = lim:allow(k[2])
                assert.same({ true, 4, "redis" }, { d.allowed, d.remaining, d.source }, k[1])
                exists[#exists + 1] = resp("EXISTS", prefix .. k[2])
            end
            -- Each one exists under its exact bytes (one reply :1 each), every
            -- one still holds 4, and Redis holds exactly these keys (the
            -- FLUSHALL after the CRLF never ran).
            assert.equal((":1\r\n"):rep(#odd_keys), srv:relay(table.concat(exists)))
            for _, k in ipairs(odd_keys) do
                assert.equal(4, lim:peek(k[2]).remaining, k[1])
            end
            assert.equal(tostring(#odd_keys), srv:cli("DBSIZE"))
            -- reset finds the very same bytes.
            assert.is_true(lim:reset("a\0b"))
            assert.equal(":0\r\n:1\r\n", srv:relay(resp("EXISTS", prefix .. "a\0b")
                .. resp("EXISTS", prefix .. "a\0c")))
            lim:close()
        end)
        srv:close()
        assert(ok, err)
    end)
end)
