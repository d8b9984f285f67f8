-- Bad arguments, at every position of every function: each raises, and the
-- message names the argument and what is wrong with it. Runtime errors are
-- another matter (nil, message, code): see redis_spec.lua.
local hirate = require "hirate"
local support = require "helpers.support"

local raises = support.raises
local lua54 = _VERSION == "Lua 5.4" or _VERSION == "Lua 5.3"

-- Each case: the options given to new, and the message it must raise.
local function with(extra)
    local o = { capacity = 10, rate = 1 }
    for k, v in pairs(extra) do
        o[k] = v
    end
    return o
end

local new_cases = {
    { "nil instead of a table", nil, "table expected, got nil" },
    { "a string instead of a table", "capacity=10", "table expected, got string" },
    { "a misspelt option", with { capactiy = 10 }, "unknown option 'capactiy'" },
    { "an option name that is not a string", with { [1] = "x" },
        "option names must be strings, got number" },
    { "no capacity", { rate = 1 }, "capacity is required (or limits)" },
    { "a capacity that is a string", with { capacity = "10" },
        "capacity must be an integer, got string" },
    { "a fractional capacity", with { capacity = 1.5 }, "capacity must be an integer, got 1.5" },
    { "a capacity of 0", with { capacity = 0 },
        "capacity must be a whole number from 1 to 2^53-1, got 0" },
    { "a negative capacity", with { capacity = -3 },
        "capacity must be a whole number from 1 to 2^53-1, got -3" },
    { "a capacity of 2^53", with { capacity = 9007199254740992 },
        "capacity must be a whole number from 1 to 2^53-1, got 9007199254740992" },
    { "a capacity of 1e300", with { capacity = 1e300 }, lua54
        and "capacity must be an integer, got 1e+300"
        or "capacity must be a whole number from 1 to 2^53-1, got 1e+300" },
    { "no rate", { capacity = 10 }, "rate is required" },
    { "a rate that is a string", with { rate = "2" }, "rate must be a number, got string" },
    { "a rate of 0", with { rate = 0 },
        "rate must be a finite number of tokens per second above 0, got 0" },
    { "a negative rate", with { rate = -1 },
        "rate must be a finite number of tokens per second above 0, got -1" },
    { "an infinite rate", with { rate = math.huge },
        "rate must be a finite number of tokens per second above 0, got inf" },
    { "a bucket that takes 2^53 us to fill", with { capacity = 1000000000, rate = 0.1 },
        "capacity 1000000000 at rate 0.1 takes over 2^53 us to refill; "
        .. "raise the rate or lower the capacity" },
    { "a url that is not a string", with { url = 6379 }, "url must be a string, got number" },
    { "a url with a NUL byte", with { url = "redis://127.0.0.1\0:6379" },
        "url contains a NUL byte" },
    { "an http url", with { url = "http://127.0.0.1" },
        "invalid Redis URL: it must start with redis://, rediss://, unix://, redis+cluster://, "
            .. "rediss+cluster://, redis+sentinel:// or rediss+sentinel://" },
    { "a url with port 0", with { url = "redis://127.0.0.1:0" },
        "invalid Redis URL: the port must be a number from 1 to 65535" },
    { "a TLS option without rediss://", with { url = "redis://127.0.0.1", tls_ca_file = "ca.crt" },
        "tls_ca_file is set, but the URL is not rediss:// (TLS)" },
    { "tls_verify with a plain URL", with { url = "redis://127.0.0.1", tls_verify = false },
        "tls_verify is off, but the URL is not rediss:// (TLS)" },
    { "tls_verify not a boolean", with { url = "rediss://127.0.0.1", tls_verify = "no" },
        "tls_verify must be a boolean, got string" },
    { "tls_server_name not a string", with { url = "rediss://127.0.0.1", tls_server_name = 7 },
        "tls_server_name must be a string, got number" },
    { "a prefix that is not a string", with { prefix = 1 }, "prefix must be a string, got number" },
    { "a prefix of 65 bytes", with { prefix = ("p"):rep(65) }, "prefix is 65 bytes; the most is 64" },
    { "a prefix with a NUL byte", with { prefix = "a\0b" }, "prefix contains a NUL byte" },
    { "an unknown policy", with { on_error = "sometimes" },
        'on_error must be "local", "open" or "closed", got "sometimes"' },
    { "a policy that is not a string", with { on_error = true },
        "on_error must be a string, got boolean" },
    { "0 instances", with { instances = 0 }, "instances must be from 1 to 100000, got 0" },
    { "fractional instances", with { instances = 2.5 }, "instances must be an integer, got 2.5" },
    { "a timeout of 0", with { timeout = 0 }, "timeout must be from 0.001 to 60 seconds, got 0" },
    { "a timeout of 61 s", with { timeout = 61 }, "timeout must be from 0.001 to 60 seconds, got 61" },
    { "a timeout just over 60 s", with { timeout = 60.0004 },
        "timeout must be from 0.001 to 60 seconds, got 60.0004" },
    { "a timeout of NaN", with { timeout = 0 / 0 },
        "timeout must be from 0.001 to 60 seconds, got -nan" },
    { "a timeout that is not a duration", with { timeout = "0.1x" },
        'timeout: "0.1x" is not a duration (a number and a unit: 250us, 100ms, 0.25s, 2m, 1h; a number alone is seconds)' },
    { "a timeout of 0ms: the range in the unit given", with { timeout = "0ms" },
        "timeout must be from 1ms to 60s, got 0ms" },
    { "a timeout that is a boolean", with { timeout = true },
        'timeout must be a number of seconds or a string with a unit ("100ms"), got boolean' },
    { "a connect timeout below a millisecond", with { connect_timeout = 0.0004 },
        "connect_timeout must be from 0.001 to 60 seconds, got 0.0004" },
    { "a deny cache that is not a boolean", with { deny_cache = 1 },
        "deny_cache must be a boolean, got number" },
    { "a deny cache bound of 0", with { deny_cache_max = 0 },
        "deny_cache_max must be from 0.001 to 86400 seconds, got 0" },
    { "a deny cache bound over a day", with { deny_cache_max = 86400.001 },
        "deny_cache_max must be from 0.001 to 86400 seconds, got 86400.001" },
    { "a deny cache bound of 25 hours", with { deny_cache_max = "25h" },
        "deny_cache_max must be from 1ms to 86400s, got 25h" },
    { "0 max keys", with { max_keys = 0 }, "max_keys must be from 1 to 4000000000, got 0" },
    { "a pool of 1025", with { pool_size = 1025 }, "pool_size must be from 1 to 1024, got 1025" },
    { "a pool size that is a string", with { pool_size = "4" },
        "pool_size must be an integer, got string" },
    { "shared that is not a boolean", with { shared = 1 },
        "shared must be a boolean, got number" },
    { "shared with nothing to share", with { url = "redis://127.0.0.1", on_error = "open",
        shared = true },
        "shared: a limiter with a URL keeps in-memory buckets only for on_error = local; "
            .. "with on_error = open it has none to share" },
}

if lua54 then
    -- 5.3 and later have integers: a float is not one, even a whole one.
    new_cases[#new_cases + 1] = { "a float capacity", with { capacity = 10.0 },
        "capacity must be an integer, got 10.0" }
end

describe("hirate.new", function()
    for _, c in ipairs(new_cases) do
        it("raises for " .. c[1], function()
            raises("bad argument #1 to 'new' (" .. c[3] .. ")", function()
                local _ = hirate.new(c[2])
            end)
        end)
    end

    it("raises for no argument", function()
        raises("bad argument #1 to 'new' (table expected, got no value)", function()
            local _ = hirate.new()
        end)
    end)

    it("never shows the password of a URL it refuses", function()
        for _, url in ipairs { "redis://app:hunter2@127.0.0.1:99999", "redis://app:hunter2@",
            "redis://app:hunter2@127.0.0.1/x", "unix://app:hunter2@relative/path" } do
            local err = support.error_of(function() local _ = hirate.new(with { url = url }) end)
            assert.truthy(err:find("invalid Redis URL", 1, true), err)
            assert.is_nil(err:find("hunter2", 1, true), err)
        end
    end)

    it("takes every option at its bounds", function()
        local lim = hirate.new {
            url = "redis://127.0.0.1:6379/15", capacity = 9007199254740991, rate = 1e9,
            prefix = ("p"):rep(64), on_error = "closed", instances = 100000, timeout = 60,
            connect_timeout = 0.001, deny_cache = false, max_keys = 4000000000, pool_size = 1024,
            deny_cache_max = 86400,
        }
        assert.equal("hirate.limiter(redis://127.0.0.1:6379/15, capacity=9007199254740991, "
            .. "rate=1000000000)", tostring(lim))
        local ep = lim:_endpoint()
        assert.same({ host = "127.0.0.1", port = 6379, where = "127.0.0.1:6379",
            connect_timeout = 0.001, timeout = 60, probe_timeout = 0.001, tls = false,
            tls_verify = false }, ep)
    end)

    it("takes durations as strings with a unit, or a number alone in seconds", function()
        local lim = hirate.new { url = "redis://127.0.0.1", capacity = 1, rate = 1,
            timeout = "250ms", connect_timeout = "0.5", deny_cache_max = "2m" }
        assert.same({ host = "127.0.0.1", port = 6379, where = "127.0.0.1:6379",
            connect_timeout = 0.5, timeout = 0.25, probe_timeout = 0.125, tls = false,
            tls_verify = false }, lim:_endpoint())
    end)

    it("rounds seconds to whole milliseconds", function()
        local lim = hirate.new { url = "redis://127.0.0.1", capacity = 1, rate = 1,
            timeout = 0.29, connect_timeout = 0.0015 }
        assert.same({ host = "127.0.0.1", port = 6379, where = "127.0.0.1:6379",
            connect_timeout = 0.002, timeout = 0.29, probe_timeout = 0.001, tls = false,
            tls_verify = false }, lim:_endpoint())
    end)
end)

describe("limiter methods", function()
    local lim = hirate.new { capacity = 10, rate = 1 }
    local long_key = ("k"):rep(513)

    -- { call, message }: each call on lim, each raising its message.
    local cases = {
        { function() local _ = lim.allow("k") end,
            "bad argument #1 to 'allow' (hirate.limiter expected, got string)" },
        -- Another library's userdata: its type is named by its __name from
        -- 5.3 on, as "userdata" before.
        { function() local _ = lim.allow(io.stdout, "k") end,
            "bad argument #1 to 'allow' (hirate.limiter expected, got "
            .. (lua54 and "FILE*" or "userdata") .. ")" },
        { function() local _ = lim.close(io.stdout) end,
            "bad argument #1 to 'close' (hirate.limiter expected, got "
            .. (lua54 and "FILE*" or "userdata") .. ")" },
        { function() local _ = lim:allow() end,
            "bad argument #1 to 'allow' (key must be a string, got no value)" },
        { function() local _ = lim:allow(42) end,
            "bad argument #1 to 'allow' (key must be a string, got number)" },
        { function() local _ = lim:allow({}) end,
            "bad argument #1 to 'allow' (key must be a string, got table)" },
        { function() local _ = lim:allow("") end, "bad argument #1 to 'allow' (key is empty)" },
        { function() local _ = lim:allow(long_key) end,
            "bad argument #1 to 'allow' (key is 513 bytes; the most is 512)" },
        { function() local _ = lim:allow("k", "1") end,
            "bad argument #2 to 'allow' (cost must be an integer, got string)" },
        { function() local _ = lim:allow("k", true) end,
            "bad argument #2 to 'allow' (cost must be an integer, got boolean)" },
        { function() local _ = lim:allow("k", 0.5) end,
            "bad argument #2 to 'allow' (cost must be an integer, got 0.5)" },
        { function() local _ = lim:allow("k", -1) end,
            "bad argument #2 to 'allow' (cost must be a whole number from 0 to 2^53-1, got -1)" },
        { function() local _ = lim:allow("k", 9007199254740992) end,
            "bad argument #2 to 'allow' (cost must be a whole number from 0 to 2^53-1, "
            .. "got 9007199254740992)" },
        { function() local _ = lim:allow("k", 0 / 0) end,
            "bad argument #2 to 'allow' (cost must be an integer, got -nan)" },
        { function() local _ = lim:peek() end,
            "bad argument #1 to 'peek' (key must be a string, got no value)" },
        { function() local _ = lim:peek("k", 1.25) end,
            "bad argument #2 to 'peek' (cost must be an integer, got 1.25)" },
        { function() local _ = lim:reset(false) end,
            "bad argument #1 to 'reset' (key must be a string, got boolean)" },
        { function() local _ = lim:reset("") end, "bad argument #1 to 'reset' (key is empty)" },
        { function() local _ = lim:allow_many() end,
            "bad argument #1 to 'allow_many' (table expected, got no value)" },
        { function() local _ = lim:allow_many { "k" } end,
            "bad argument #1 to 'allow_many' (item 1 must be a table {key, cost}, got string)" },
        { function() local _ = lim:allow_many { { "a", 1 }, { "", 1 } } end,
            "bad argument #1 to 'allow_many' (item 2: key is empty)" },
        { function() local _ = lim:allow_many { { 7, 1 } } end,
            "bad argument #1 to 'allow_many' (item 1: key must be a string, got number)" },
        { function() local _ = lim:allow_many { { "a", 1 }, { "b", 2 }, { "c", -4 } } end,
            "bad argument #1 to 'allow_many' (item 3: cost must be a whole number from 0 to "
            .. "2^53-1, got -4)" },
        { function() local _ = lim:allow_many { { "a", "2" } } end,
            "bad argument #1 to 'allow_many' (item 1: cost must be an integer, got string)" },
        { function() local _ = lim:_decide_at("k", 1, nil, 0) end,
            "bad argument #3 to '_decide_at' (spend must be a boolean or \"refund\", got nil)" },
        { function() local _ = lim:_decide_at("k", 1, true) end,
            "bad argument #4 to '_decide_at' (now_us must be an integer, got no value)" },
        { function() local _ = lim:_decide_at("k", 1, true, -1) end,
            "bad argument #4 to '_decide_at' (now_us must be from 0 to 9007199254740991, got -1)" },
        { function() local _ = lim:_decide_at("", 1, true, 0) end,
            "bad argument #1 to '_decide_at' (key is empty)" },
        { function() local _ = lim:_decide_at("k", -1, true, 0) end,
            "bad argument #2 to '_decide_at' (cost must be a whole number from 0 to 2^53-1, "
            .. "got -1)" },
        { function() local _ = lim:_op_start_reset("") end,
            "bad argument #1 to '_op_start_reset' (key is empty)" },
    }
    if lua54 then
        cases[#cases + 1] = { function() local _ = lim:allow("k", 1.0) end,
            "bad argument #2 to 'allow' (cost must be an integer, got 1.0)" }
    end

    for i, c in ipairs(cases) do
        it(("raise with the argument named (%d: %s)"):format(i, c[2]:match("%((.*)%)$")),
            function()
                raises(c[2], c[1])
            end)
    end

    it("spend nothing of a batch when one item is bad", function()
        local l = hirate.new { capacity = 10, rate = 0.001 }
        assert.has_error(function() local _ = l:allow_many { { "a", 3 }, { "b", 4 }, { "", 1 } } end)
        assert.equal(10, l:peek("a").remaining)
        assert.equal(10, l:peek("b").remaining)
    end)

    it("take a cost of nil as 1", function()
        local l = hirate.new { capacity = 10, rate = 0.001 }
        assert.equal(9, l:allow("k", nil).remaining)
        assert.equal(8, l:allow("k").remaining)
        assert.equal(7, l:allow_many { { "k" } }[1].remaining)
    end)

    it("take keys with any bytes", function()
        local l = hirate.new { capacity = 10, rate = 0.001 }
        for _, key in ipairs { "a\0b", "\255\254", "\r\n", "%s%n", "{}", ("k"):rep(512) } do
            assert.equal(9, l:allow(key).remaining)
        end
        -- "a\0b" and "a" are two keys, not one cut at the NUL.
        assert.equal(10, l:peek("a").remaining)
    end)
end)

describe("the hooks for the OpenResty path", function()
    it("need a limiter with a Redis URL", function()
        local lim = hirate.new { capacity = 10, rate = 1 }
        local msg = "needs a limiter with a Redis URL (this one is in memory)"
        raises("_op_start " .. msg, function() local _ = lim:_op_start({}, true) end)
        raises("_endpoint " .. msg, function() local _ = lim:_endpoint() end)
        raises("_handshake_start " .. msg, function() local _ = lim:_handshake_start() end)
        raises("_op_start_reset " .. msg, function() local _ = lim:_op_start_reset("k") end)
    end)

    -- Nothing here connects: _op_start only encodes the request.
    local lim = hirate.new { url = "redis://127.0.0.1:1", capacity = 10, rate = 1 }

    local cases = {
        { function() local _ = lim:_op_start() end,
            "bad argument #1 to '_op_start' (table expected, got no value)" },
        { function() local _ = lim:_op_start({ { "", 1 } }, true) end,
            "bad argument #1 to '_op_start' (item 1: key is empty)" },
        { function() local _ = lim:_op_start({ { "k", 0.5 } }, true) end,
            "bad argument #1 to '_op_start' (item 1: cost must be an integer, got 0.5)" },
        { function() local _ = lim:_op_start({ { "k", 1 } }) end,
            "bad argument #2 to '_op_start' (spend must be a boolean or \"refund\", got no value)" },
        { function() local _ = lim:_op_start({ { "k", 1 } }, "yes") end,
            "bad argument #2 to '_op_start' (spend must be a boolean or \"refund\", got string)" },
        { function() local _ = lim:_op_start({ { "k", 1 } }, true, -5) end,
            "bad argument #3 to '_op_start' (now_us must be from 0 to 9007199254740991, got -5)" },
        { function() local _ = lim:_op_start({ { "k", 1 } }, true, 1.5) end,
            "bad argument #3 to '_op_start' (now_us must be an integer, got 1.5)" },
    }
    for i, c in ipairs(cases) do
        it(("raise with the argument named (%d: %s)"):format(i, c[2]:match("%((.*)%)$")),
            function()
                raises(c[2], c[1])
            end)
    end

    it("check an op's arguments and state", function()
        local op = lim:_op_start({ { "k", 1 } }, true)
        assert.equal("hirate.op(waiting, 1 items)", tostring(op))
        raises("results: the op still waits for Redis (feed it the replies, or fail it)",
            function() local _ = op:results() end)
        raises("bad argument #1 to 'feed' (bytes must be a string, got number)",
            function() local _ = op:feed(5) end)
        raises('bad argument #1 to \'fail\' (code must be an error name such as "ETIMEDOUT", '
            .. 'got "ETIMEOUT")', function() op:fail("ETIMEOUT") end)
        raises('bad argument #1 to \'fail\' (code must be an error name such as "ETIMEDOUT", '
            .. "got nil)", function() op:fail(nil) end)
        -- A limiter where an op belongs, and an op where a limiter does.
        raises("bad argument #1 to 'request' (hirate.op expected, got "
            .. (lua54 and "hirate.limiter" or "userdata") .. ")",
            function() local _ = op.request(lim) end)
        raises("bad argument #1 to '_endpoint' (hirate.limiter expected, got "
            .. (lua54 and "hirate.op" or "userdata") .. ")",
            function() local _ = lim._endpoint(op) end)
        op:fail("ECONNECT")
        assert.equal("hirate.op(done, 1 items)", tostring(op))
        raises("feed: the op is done (it has its results)", function() local _ = op:feed("+OK\r\n") end)
        op:fail("EIO")   -- does nothing once the op is done
        local d = op:results()[1]
        assert.equal("ECONNECT", d.error)
        op:free()
        op:free()
    end)
end)
