-- The shared test vectors (tests/vectors/token_bucket.json), every case
-- through the Lua API: on the memory backend, on a real Redis running the
-- real script (the time injected with lim:_decide_at) both as a Redis
-- Functions library (FCALL, the default on Redis 7) and as a script
-- (EVALSHA, functions = false), and on Redis with the deny cache, whose
-- refusals must carry Redis' own values. Every field of every decision is
-- compared exactly; an error the vectors expect must be raised, with a
-- message that names what is wrong.
local json = require "dkjson"
local hirate = require "hirate"
local support = require "helpers.support"
local redis_server = require "helpers.redis_server"

local doc = assert(json.decode(support.read(support.root .. "/tests/vectors/token_bucket.json")))
assert(doc.version == 1, "a vector file of a version this runner does not know")
assert(#doc.cases > 0)

-- A key in one of its three spellings.
local function key_of(k)
    if type(k) == "string" then
        return k
    elseif k.hex then
        return (k.hex:gsub("%x%x", function(h) return string.char(tonumber(h, 16)) end))
    else
        return k["repeat"]:rep(k.times)
    end
end

local special = { nan = 0 / 0, inf = math.huge, ["-inf"] = -math.huge }
local function rate_of(r)
    return special[r] or r
end

-- What each error code's message must mention.
local mentions = {
    HIRATE_ECAPACITY = "capacity",
    HIRATE_ERATE = "rate",
    HIRATE_ERANGE = "takes over 2^53 us to refill",
    HIRATE_ECOST = "cost",
    HIRATE_EKEY = "key",
}

-- The figures of a decision or a band the Lua API must give for an expect
-- object: seconds are the microseconds divided by 1e6, as the binding divides
-- them; band (nil: none) is the vector's 0-based number as Lua numbers it.
local function figures(e, band, source, t_us)
    return {
        allowed = e.allowed,
        remaining = e.remaining,
        limit = e.limit,
        retry_after = e.retry_after_us == "never" and math.huge or e.retry_after_us / 1e6,
        reset_after = e.reset_after_us / 1e6,
        source = source,
        time = t_us / 1e6,   -- the injected time, on every path
        band = band and band + 1,
    }
end

-- The decision: the whole's figures, and in multi-band cases (a limiter
-- made with limits) band and each band's figures, named as the limiter
-- names its bands (names: lim:bands()). A limiter of capacity and rate
-- gives neither.
local function wanted(e, source, t_us, names)
    local d = figures(e, e.bands and (e.band or 0), source, t_us)
    if e.bands then
        d.bands = {}
        for i, b in ipairs(e.bands) do
            d.bands[i] = figures(b, i - 1, source, t_us)
            d.bands[i].name = names[i]
        end
    end
    return d
end

-- A vector's config as hirate.new's options: capacity and rate, or limits
-- (the bands, each {capacity =, rate =, name =}).
local function limit_options(config, opts)
    if config.bands then
        local limits = {}
        for i, b in ipairs(config.bands) do
            limits[i] = { capacity = b.capacity, rate = rate_of(b.rate), name = b.name }
        end
        opts.limits = limits
    else
        opts.capacity = config.capacity
        opts.rate = rate_of(config.rate)
    end
    return opts
end

local function names_of(lim)
    local names = {}
    for i, b in ipairs(lim:bands()) do
        names[i] = b.name
    end
    return names
end

-- Runs one case; backend is {url=, deny_cache=, prefix=, source=,
-- tls_ca_file=, functions=}. On Redis, the calls must have gone the
-- backend's way: FCALL only, or EVALSHA (and EVAL) only.
-- The spend argument of _decide_at for a step's op.
local function spend_of(op)
    if op == "refund" then return "refund" end
    return op == "allow"
end

local function run_case(c, backend)
    if c.redis_only and not backend.url then
        return 0   -- its bands change under a key: a memory backend's cannot
    end
    local opts = limit_options(c.config, {
        url = backend.url,
        prefix = backend.prefix .. c.id .. ":",
        deny_cache = backend.deny_cache,
        shared = backend.shared,
        tls_ca_file = backend.tls_ca_file,
        functions = backend.functions,
        -- A slow machine must not turn into a fallback.
        timeout = 5,
        connect_timeout = 5,
    })
    if c.config_error then
        local err = support.error_of(hirate.new, opts)
        assert.truthy(err:find("bad argument #1 to '", 1, true), err)
        assert.truthy(err:find(mentions[c.config_error], 1, true),
            c.config_error .. " without '" .. mentions[c.config_error] .. "': " .. err)
        return 0
    end
    local lim = hirate.new(opts)
    local names = names_of(lim)
    local hits, decided, stats = 0, 0, {}
    for i, step in ipairs(c.steps) do
        local where = ("case %s, step %d"):format(c.id, i - 1)
        local key = step.key and key_of(step.key)
        if step.op == "reconfigure" then
            -- A new limiter of the step's config on the same prefix: the
            -- keys already in Redis stay.
            stats[#stats + 1] = lim:_stats()
            lim:close()
            opts.capacity, opts.rate, opts.limits = nil, nil, nil
            lim = hirate.new(limit_options(step.config, opts))
            names = names_of(lim)
        elseif step.op == "reset" then
            assert.is_true(lim:reset(key), where)
        elseif step.expect_error then
            local err = support.error_of(function()
                local _ = lim:_decide_at(key, step.cost or 1, spend_of(step.op), step.t_us)
            end)
            local arg = step.expect_error == "HIRATE_EKEY" and "#1" or "#2"
            assert.truthy(err:find("bad argument " .. arg .. " to '_decide_at' (", 1, true),
                where .. ": " .. err)
            assert.truthy(err:find(mentions[step.expect_error], 1, true), where .. ": " .. err)
        else
            assert(step.op == "allow" or step.op == "peek" or step.op == "refund",
                where .. ": unknown op " .. step.op)
            local d, msg, code = lim:_decide_at(key, step.cost or 1, spend_of(step.op), step.t_us)
            assert(d, where .. ": " .. tostring(msg) .. " " .. tostring(code))
            local source = backend.source
            if backend.deny_cache and d.source == "cache" and not d.allowed then
                source, hits = "cache", hits + 1
            else
                decided = decided + 1
            end
            assert.same(wanted(step.expect, source, step.t_us, names), d, where)
        end
    end
    if backend.url then
        local script = { fcall = 0, function_loads = 0, evalsha = 0, eval = 0 }
        stats[#stats + 1] = lim:_stats()
        for _, s in ipairs(stats) do
            for k in pairs(script) do
                script[k] = script[k] + s[k]
            end
        end
        if backend.functions == false then
            assert.same({ 0, 0 }, { script.fcall, script.function_loads }, c.id)
            assert.is_true(script.evalsha >= decided, c.id)
        else
            assert.same({ 0, 0 }, { script.evalsha, script.eval }, c.id)
            assert.is_true(script.fcall >= decided, c.id)
        end
    end
    lim:close()
    return hits
end

describe("the test vectors", function()
    describe("on the memory backend", function()
        for _, c in ipairs(doc.cases) do
            it(c.id, function()
                run_case(c, { prefix = "vec:", source = "local" })
            end)
        end
    end)

    describe("on the memory backend shared with forked processes", function()
        for _, c in ipairs(doc.cases) do
            it(c.id, function()
                run_case(c, { prefix = "vec:", source = "local", shared = true })
            end)
        end
    end)

    describe("on Redis", function()
        local srv, hits
        setup(function()
            srv = redis_server.start()
            hits = 0
        end)
        teardown(function()
            if srv then srv:close() end
        end)

        for _, c in ipairs(doc.cases) do
            it(c.id, function()
                run_case(c, { url = srv.url, prefix = "vec:", deny_cache = false, source = "redis" })
            end)
        end

        for _, c in ipairs(doc.cases) do
            it(c.id .. " (with the deny cache)", function()
                hits = hits + run_case(c, { url = srv.url, prefix = "vc:", deny_cache = true,
                    source = "redis" })
            end)
        end

        for _, c in ipairs(doc.cases) do
            it(c.id .. " (EVALSHA: functions = false)", function()
                run_case(c, { url = srv.url, prefix = "ves:", deny_cache = false,
                    source = "redis", functions = false })
            end)
        end

        it("answered refusals from the deny cache, with Redis' values", function()
            -- The C runner sees more than 20 on the same file.
            assert.is_true(hits > 20, "deny cache hits: " .. hits)
        end)

        it("left keys under the runner's prefixes only, each with a TTL", function()
            -- Counted inside Redis: keys may hold any bytes, which redis-cli cannot
            -- print one a line.
            local count = [[
                local n, stray, eternal = 0, 0, 0
                for _, k in ipairs(redis.call("KEYS", "*")) do
                    n = n + 1
                    if k:sub(1, 4) ~= "vec:" and k:sub(1, 3) ~= "vc:" and k:sub(1, 4) ~= "ves:" then
                        stray = stray + 1
                    end
                    if redis.call("PTTL", k) <= 0 then eternal = eternal + 1 end
                end
                return {n, stray, eternal}
            ]]
            local n, stray, eternal = srv:cli("EVAL", count, "0"):match("^(%d+)\n(%d+)\n(%d+)$")
            assert.is_true(tonumber(n) > 0)
            assert.equal("0", stray)
            assert.equal("0", eternal)
        end)
    end)

    describe("on Redis over TLS", function()
        local srv, ca
        setup(function()
            srv = redis_server.start({}, { tls = "server" })
            ca = redis_server.certs() .. "/ca.crt"
        end)
        teardown(function()
            if srv then srv:close() end
        end)

        for _, c in ipairs(doc.cases) do
            it(c.id, function()
                run_case(c, { url = srv.tls_url, tls_ca_file = ca, prefix = "vt:",
                    deny_cache = false, source = "redis" })
            end)
        end
    end)
end)
