-- Redis Functions from Lua: the token bucket as a function library, loaded
-- once with FUNCTION LOAD and called with FCALL where the server has Redis
-- Functions (Redis 7); EVALSHA (EVAL after NOSCRIPT) with functions = false,
-- and where an ACL forbids FUNCTION or FCALL, said once through the log
-- option. The counters are the core's (lim:_stats()); INFO commandstats is
-- Redis' own account.
local hirate = require "hirate"
local support = require "helpers.support"
local redis_server = require "helpers.redis_server"

local PW = "acl-secret"

-- The counters of the script calls, as a list for assert.same.
local function calls(lim)
    local s = lim:_stats()
    return { fcall = s.fcall, function_loads = s.function_loads, evalsha = s.evalsha,
        eval = s.eval }
end

-- Redis' count of each command in INFO commandstats ("fcall", "evalsha" ...).
local function commandstats(srv)
    local out = {}
    for name, n in srv:cli("INFO", "commandstats"):gmatch("cmdstat_([%w|_]+):calls=(%d+)") do
        out[name] = tonumber(n)
    end
    return out
end

describe("Redis Functions", function()
    local srv
    setup(function()
        srv = redis_server.start()
        srv:cli("ACL", "SETUSER", "nofunction", "on", ">" .. PW, "~*", "+@all", "-function")
        srv:cli("ACL", "SETUSER", "nofcall", "on", ">" .. PW, "~*", "+@all", "-fcall")
    end)
    teardown(function()
        if srv then srv:close() end
    end)
    before_each(function()
        -- Every case starts from a server that has no bucket, neither the
        -- library nor the script, and its command counts at 0.
        srv:cli("FLUSHALL")
        srv:cli("FUNCTION", "FLUSH")
        srv:cli("SCRIPT", "FLUSH")
        srv:cli("CONFIG", "RESETSTAT")
    end)

    local function new(opts, lines)
        local o = { url = srv.url, capacity = 100, rate = 1, deny_cache = false, timeout = 5,
            connect_timeout = 5 }
        for k, v in pairs(opts or {}) do
            o[k] = v
        end
        if lines then
            o.log = function(level, msg)
                lines[#lines + 1] = { level, msg }
            end
        end
        return hirate.new(o)
    end

    local function as(user)
        return ("redis://%s:%s@127.0.0.1:%d"):format(user, PW, srv.port)
    end

    it("names the library after the script, around the script's very source", function()
        local name = hirate.function_name()
        assert.equal("hirate_" .. hirate.script_sha1():sub(1, 16), name)
        local lib = hirate.function_library()
        assert.equal("#!lua name=" .. name .. "\n", lib:sub(1, #name + 12))
        assert.truthy(lib:find(hirate.script_source(), 1, true))
    end)

    it("loads the library once on a fresh Redis 7, then decides with FCALL only", function()
        local lines = {}
        local lim = new({}, lines)
        assert.same({ true, 99, "redis" }, (function()
            local d = lim:allow("k")
            return { d.allowed, d.remaining, d.source }
        end)())
        -- FCALL, "Function not found", FUNCTION LOAD, FCALL again.
        assert.same({ fcall = 2, function_loads = 1, evalsha = 0, eval = 0 }, calls(lim))
        for i = 2, 10 do
            assert.equal(100 - i, lim:allow("k").remaining)
        end
        assert.same({ fcall = 11, function_loads = 1, evalsha = 0, eval = 0 }, calls(lim))
        local stats = commandstats(srv)
        assert.equal(11, stats.fcall)
        assert.is_nil(stats.evalsha)
        assert.is_nil(stats.eval)
        assert.equal(1, stats["function|load"])
        assert.truthy(srv:cli("FUNCTION", "LIST"):find(hirate.function_name(), 1, true))
        assert.same({}, lines)
        lim:close()
    end)

    it("finds a library already loaded and loads nothing", function()
        assert.equal(hirate.function_name(), srv:cli("FUNCTION", "LOAD", hirate.function_library()))
        local lim = new()
        assert.equal("redis", lim:allow("k").source)
        assert.same({ fcall = 1, function_loads = 0, evalsha = 0, eval = 0 }, calls(lim))
        lim:close()
    end)

    it("loads the library again after FUNCTION FLUSH, once", function()
        local lim = new()
        lim:allow("k")
        srv:cli("FUNCTION", "FLUSH")
        assert.equal(98, lim:allow("k").remaining)
        assert.equal(97, lim:allow("k").remaining)
        assert.same({ fcall = 5, function_loads = 2, evalsha = 0, eval = 0 }, calls(lim))
        lim:close()
    end)

    it("leaves a library of another hirate version alone", function()
        local other = "#!lua name=hirate_0000000000000000\n"
            .. "redis.register_function('hirate_0000000000000000', function() return 7 end)"
        assert.equal("hirate_0000000000000000", srv:cli("FUNCTION", "LOAD", other))
        local lim = new()
        assert.equal(99, lim:allow("k").remaining)
        local list = srv:cli("FUNCTION", "LIST")
        assert.truthy(list:find("hirate_0000000000000000", 1, true))
        assert.truthy(list:find(hirate.function_name(), 1, true))
        assert.equal("7", srv:cli("FCALL", "hirate_0000000000000000", "0"))
        lim:close()
    end)

    it("decides with EVALSHA, then EVAL after NOSCRIPT, with functions = false", function()
        local lines = {}
        local lim = new({ functions = false }, lines)
        assert.equal(99, lim:allow("k").remaining)
        assert.same({ fcall = 0, function_loads = 0, evalsha = 1, eval = 1 }, calls(lim))
        for i = 2, 10 do
            assert.equal(100 - i, lim:allow("k").remaining)
        end
        assert.same({ fcall = 0, function_loads = 0, evalsha = 10, eval = 1 }, calls(lim))
        local stats = commandstats(srv)
        assert.is_nil(stats.fcall)
        assert.is_nil(stats["function|load"])
        assert.equal(10, stats.evalsha)
        assert.same({}, lines)
        lim:close()
    end)

    -- The one line an ACL that forbids Redis Functions earns, whatever it
    -- forbids.
    local function warned(lines)
        assert.equal(1, #lines, "log lines: " .. #lines)
        assert.equal("warning", lines[1][1])
        local head = ("Redis Functions are not usable on 127.0.0.1:%d (Redis replied: NOPERM ")
            :format(srv.port)
        local tail = "): deciding with EVALSHA there"
        local msg = lines[1][2]
        assert.equal(head, msg:sub(1, #head), msg)
        assert.equal(tail, msg:sub(-#tail), msg)
        assert.is_nil(msg:find(PW, 1, true), msg)
    end

    it("falls back to EVALSHA where the ACL forbids FUNCTION, and says so once in 50 calls",
        function()
        local lines = {}
        local lim = new({ url = as("nofunction") }, lines)
        assert.equal(99, lim:allow("k").remaining)
        assert.same({ fcall = 2, function_loads = 1, evalsha = 1, eval = 1 }, calls(lim))
        for i = 2, 50 do
            local d = lim:allow("k")
            assert.same({ true, 100 - i, "redis" }, { d.allowed, d.remaining, d.source })
        end
        assert.same({ fcall = 2, function_loads = 1, evalsha = 50, eval = 1 }, calls(lim))
        warned(lines)
        lim:close()
    end)

    it("falls back to EVALSHA where the ACL forbids FCALL, and says so once in 50 calls",
        function()
        local lines = {}
        local lim = new({ url = as("nofcall") }, lines)
        assert.equal(99, lim:allow("k").remaining)
        assert.same({ fcall = 1, function_loads = 0, evalsha = 1, eval = 1 }, calls(lim))
        for _ = 2, 50 do
            assert.equal("redis", lim:allow("k").source)
        end
        assert.same({ fcall = 1, function_loads = 0, evalsha = 50, eval = 1 }, calls(lim))
        warned(lines)
        lim:close()
    end)

    it("hands log lines to the log function after the call, and drops its errors", function()
        local lim = new { url = as("nofunction"), log = function() error("the log is full") end }
        local d, err = lim:allow("k")
        assert(d, err)
        assert.same({ true, 99, "redis" }, { d.allowed, d.remaining, d.source })
        lim:close()
        -- Without a log function the line goes nowhere.
        lim = new { url = as("nofcall") }
        assert.equal("redis", lim:allow("k").source)
        lim:close()
    end)

    it("checks the types of functions and log", function()
        support.raises("bad argument #1 to 'new' (functions must be a boolean, got string)",
            function() local _ = hirate.new { capacity = 1, rate = 1, functions = "yes" } end)
        support.raises("bad argument #1 to 'new' (log must be a function(level, message), got "
            .. "number)", function() local _ = hirate.new { capacity = 1, rate = 1, log = 1 } end)
    end)
end)
