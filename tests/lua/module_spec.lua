-- The module itself: its fields and functions, tostring, and the lifetime of
-- a limiter (close, __gc, <close>).
local hirate = require "hirate"
local core = require "hirate.core"
local support = require "helpers.support"

local raises, read, root = support.raises, support.read, support.root
local settled_live = support.settled_live

local function closed(...)
    assert.same({ n = 3, nil, "limiter is closed", "ECLOSED" }, support.pack(...))
end

describe("the module", function()
    it("names itself and its version, the C header's", function()
        local header = read(root .. "/core/include/hirate.h")
        local version = header:match('#define HIRATE_VERSION_STRING "([^"]+)"')
        assert.equal("0.2.0", version)
        assert.equal(version, hirate._VERSION)
        assert.equal("hirate", hirate._NAME)
        assert.equal(version, core._VERSION)
        assert.equal("hirate.core", core._NAME)
        assert.equal(version, core.version())
        assert.equal(version, hirate.version())
    end)

    it("has the rockspec the version names", function()
        local rockspec = read(root .. "/hirate-" .. hirate._VERSION .. "-1.rockspec")
        assert.equal(hirate._VERSION .. "-1", rockspec:match('\nversion = "([^"]+)"'))
    end)

    it("embeds lua/token_bucket.lua byte for byte", function()
        assert.equal(read(root .. "/lua/token_bucket.lua"), core.script_source())
        assert.equal(core.script_source, hirate.script_source)
    end)

    it("gives the script's SHA1 as 40 lowercase hex digits", function()
        -- Redis computes it too: redis_spec.lua compares it with SCRIPT LOAD.
        assert.truthy(core.script_sha1():match("^" .. ("%x"):rep(40) .. "$"))
        assert.equal(core.script_sha1():lower(), core.script_sha1())
        assert.equal(core.script_sha1, hirate.script_sha1)
    end)

    it("states the core's limits, from its header", function()
        local header = read(root .. "/core/include/hirate.h")
        local io_header = read(root .. "/core/include/hirate_io.h")
        local function define(text, name)
            return tonumber((text:match("#define " .. name .. " (%d+)")))
        end
        assert.same({ define(header, "HIRATE_KEY_MAX"), define(header, "HIRATE_PREFIX_MAX"),
            9007199254740991, define(io_header, "HIRATE_IO_REPLY_MAX"),
            define(header, "HIRATE_ERRMSG_SIZE") },
            { core.KEY_MAX, core.PREFIX_MAX, core.EXACT_MAX, core.IO_REPLY_MAX, core.ERRMSG_SIZE })
        assert.equal(header:match("#define HIRATE_EXACT_MAX (%d+)LL"), ("%.0f"):format(core.EXACT_MAX))
        assert.same({ core.KEY_MAX, core.PREFIX_MAX, core.EXACT_MAX },
            { hirate.KEY_MAX, hirate.PREFIX_MAX, hirate.EXACT_MAX })
        -- Integers where Lua has them.
        if math.type then
            assert.equal("integer", math.type(core.EXACT_MAX))
        end
    end)

    it("makes the C limiter in plain Lua (no ngx)", function()
        assert.is_nil(rawget(_G, "ngx"))
        assert.equal(core.new, hirate.new)
    end)
end)

describe("tostring(limiter)", function()
    it("shows where the buckets are, the capacity and the rate", function()
        local lim = hirate.new { capacity = 10, rate = 2 }
        assert.equal("hirate.limiter(memory, capacity=10, rate=2)", tostring(lim))
        lim = hirate.new { capacity = 3, rate = 0.1, url = "redis://127.0.0.1:6379" }
        assert.equal("hirate.limiter(redis://127.0.0.1:6379, capacity=3, rate=0.1)", tostring(lim))
        lim = hirate.new { capacity = 9007199254740991, rate = 1e9 }
        assert.equal("hirate.limiter(memory, capacity=9007199254740991, rate=1000000000)",
            tostring(lim))
        lim = hirate.new { capacity = 1, rate = 1 / 3 }
        assert.equal("hirate.limiter(memory, capacity=1, rate=0.3333333333333333)", tostring(lim))
    end)

    it("replaces the password with ***", function()
        local cases = {
            { "redis://:hunter2@127.0.0.1:6379", "redis://:***@127.0.0.1:6379" },
            { "redis://app:hunter2@127.0.0.1:6379/3", "redis://app:***@127.0.0.1:6379/3" },
            { "redis://app:hun@ter2@localhost", "redis://app:***@localhost" },
            { "redis://app:hunter%40two@[::1]:7000", "redis://app:***@[::1]:7000" },
            { "unix://:hunter2@/run/redis.sock?db=2", "unix://:***@/run/redis.sock?db=2" },
            { "unix:///run/redis.sock", "unix:///run/redis.sock" },
            { "rediss://app:hunter2@redis.internal:6380/1", "rediss://app:***@redis.internal:6380/1" },
        }
        for _, c in ipairs(cases) do
            local lim = hirate.new { capacity = 1, rate = 1, url = c[1] }
            assert.equal("hirate.limiter(" .. c[2] .. ", capacity=1, rate=1)", tostring(lim))
            assert.is_nil(tostring(lim):find("hunter", 1, true))
        end
    end)

    it("says when the limiter is closed", function()
        local lim = hirate.new { capacity = 10, rate = 2 }
        lim:close()
        assert.equal("hirate.limiter(memory, capacity=10, rate=2, closed)", tostring(lim))
    end)
end)

describe("closing a limiter", function()
    it("makes every call answer nil, 'limiter is closed', 'ECLOSED'", function()
        local lim = hirate.new { capacity = 10, rate = 2 }
        assert.is_true(lim:allow("k").allowed)
        assert.is_true(lim:close())
        closed(lim:allow("k"))
        closed(lim:peek("k"))
        closed(lim:reset("k"))
        closed(lim:allow_many { { "k", 1 } })
        closed(lim:_decide_at("k", 1, true, 0))
        closed(lim:_stats())
    end)

    it("answers ECLOSED for the Redis hooks too", function()
        local lim = hirate.new { capacity = 10, rate = 2, url = "redis://127.0.0.1:1" }
        lim:close()
        closed(lim:_op_start({ { "k", 1 } }, true))
        closed(lim:_endpoint())
        closed(lim:_handshake_start())
        closed(lim:_op_start_reset("k"))
    end)

    it("is idempotent", function()
        local lim = hirate.new { capacity = 10, rate = 2 }
        local live = settled_live()
        assert.is_true(lim:close())
        assert.equal(live - 1, core._live())
        assert.is_true(lim:close())
        assert.is_true(lim:close())
        assert.equal(live - 1, core._live())
        closed(lim:allow("k"))
    end)

    it("still checks the arguments first: a bad one raises", function()
        local lim = hirate.new { capacity = 10, rate = 2 }
        lim:close()
        raises("bad argument #1 to 'allow' (key is empty)", function() local _ = lim:allow("") end)
    end)

    it("frees the C limiter when the garbage collector takes an open one", function()
        local live = settled_live()
        do
            local a = hirate.new { capacity = 10, rate = 2 }
            local b = hirate.new { capacity = 10, rate = 2, url = "redis://127.0.0.1:1",
                connect_timeout = 0.05 }
            a:allow("k")
            b:allow("k")   -- a failed connect, decided by the local fallback
            assert.equal(live + 2, core._live())
            -- LuaJIT keeps a dead local's stack slot, and marks it, until
            -- something else is written there: let go of the two explicitly.
            a, b = nil, nil
        end
        assert.equal(live, settled_live())
    end)

    it("lets the garbage collector take a closed one without freeing it twice", function()
        local live = settled_live()
        do
            local lim = hirate.new { capacity = 10, rate = 2 }
            lim:close()
            lim = nil   -- as above: LuaJIT would keep marking its stack slot
        end
        assert.equal(live, settled_live())
    end)

    if _VERSION == "Lua 5.4" then
        -- Parsed at run time: <close> is a syntax error before 5.4 and in LuaJIT.
        local scoped = assert(load([[
            local hirate, fail = ...
            local lim <close> = hirate.new { capacity = 10, rate = 2 }
            assert(lim:allow("k").allowed)
            if fail then error("raised inside the scope") end
            return lim
        ]], "=scoped"))

        it("closes a limiter at the end of its scope (local lim <close>)", function()
            local live = settled_live()
            local lim = scoped(hirate, false)
            assert.equal(live, core._live())
            closed(lim:allow("k"))
        end)

        it("closes it when an error leaves the scope", function()
            local live = settled_live()
            local ok, err = pcall(scoped, hirate, true)
            assert.is_false(ok)
            assert.equal("scoped:4: raised inside the scope", err)
            assert.equal(live, core._live())
        end)
    end
end)
