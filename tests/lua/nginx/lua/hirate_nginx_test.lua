--[[
The limiters and handlers of the nginx tests' own server (test_server.conf).

The limiters are made when a worker first requires this module: the
"lazily, at module level" pattern of docs/lua.md, one set per worker. The
doc's own snippet shows the other pattern (init_worker_by_lua_block).
Responses are small JSON documents that tests/lua/nginx/test_nginx.py reads.
]]

local hirate = require "hirate"
local resty = require "hirate.resty"
local json = require "dkjson"

local url = os.getenv("REDIS_URL")
local port = os.getenv("HIRATE_TEST_REDIS_PORT")
local unix = os.getenv("HIRATE_TEST_REDIS_UNIX")
local dead = os.getenv("HIRATE_TEST_DEAD_PORT") -- nothing listens there
local trickle = os.getenv("HIRATE_TEST_TRICKLE_PORT") -- replies a byte at a time
-- TLS: a server with a plain and a TLS port (server.crt, for localhost and
-- 127.0.0.1); one for mutual TLS; one presenting each bad certificate; one
-- at maxclients 1 that the tests keep busy. nginx trusts the test CA
-- (lua_ssl_trusted_certificate).
local certs = os.getenv("HIRATE_TEST_CERTS")
local tls_port = os.getenv("HIRATE_TEST_TLS_PORT")
local tls_plain_port = os.getenv("HIRATE_TEST_TLS_PLAIN_PORT")
local mtls_port = os.getenv("HIRATE_TEST_MTLS_PORT")
local maxclients_port = os.getenv("HIRATE_TEST_MAXCLIENTS_PORT")
local maxclients_tls_port = os.getenv("HIRATE_TEST_MAXCLIENTS_TLS_PORT")
local bad_ports = {
    wronghost = os.getenv("HIRATE_TEST_WRONGHOST_PORT"),
    expired = os.getenv("HIRATE_TEST_EXPIRED_PORT"),
    selfsigned = os.getenv("HIRATE_TEST_SELFSIGNED_PORT"),
}
local tls_url = "rediss://127.0.0.1:" .. tls_port

local M = {}

local function arg_key()
    return ngx.var.arg_k
end

local function arg_cost()
    return tonumber(ngx.var.arg_cost) or 1
end

local function redis(opts)
    opts.url = opts.url or url
    return hirate.new(opts)
end

-- The limits applied with resty.limit, by name (location /limit/<name>).
local limits = {
    exact = { limiter = redis { capacity = 20, rate = 0.001, prefix = "t-exact:" },
        key = "var:arg_k" },
    deny = { limiter = redis { capacity = 2, rate = 0.001, prefix = "t-deny:" },
        key = "var:arg_k" },
    headers = { limiter = redis { capacity = 2, rate = 0.5, prefix = "t-hdr:" }, key = "var:arg_k",
        cost = arg_cost },
    legacy = { limiter = redis { capacity = 2, rate = 0.5, prefix = "t-legacy:" },
        key = "var:arg_k", legacy_headers = true, name = "burst" },
    bare = { limiter = redis { capacity = 1, rate = 0.25, prefix = "t-bare:" }, key = "var:arg_k",
        headers = false, status = 503, body = "slow down\n" },
    open = { limiter = redis { capacity = 4, rate = 0.001, prefix = "t-open:", on_error = "open",
        timeout = 1, connect_timeout = 1 }, key = "var:arg_k" },
    closed = { limiter = redis { capacity = 4, rate = 0.001, prefix = "t-closed:",
        on_error = "closed", timeout = 1, connect_timeout = 1 }, key = "var:arg_k" },
    ["local"] = { limiter = redis { capacity = 4, rate = 0.001, prefix = "t-local:",
        on_error = "local", instances = 2, timeout = 1, connect_timeout = 1 }, key = "var:arg_k" },
    xff = { limiter = redis { capacity = 1, rate = 0.001, prefix = "t-xff:" },
        trusted_proxies = { "127.0.0.1/32", "10.0.0.0/8" } },
    untrusted = { limiter = redis { capacity = 1, rate = 0.001, prefix = "t-untrusted:" },
        trusted_proxies = { "10.0.0.0/8" } },
    noxff = { limiter = redis { capacity = 1, rate = 0.001, prefix = "t-noxff:" } },
    fwd = { limiter = redis { capacity = 1, rate = 0.001, prefix = "t-fwd:" },
        trusted_proxies = { "127.0.0.1" }, forwarded_header = "Forwarded" },
    hops = { limiter = redis { capacity = 1, rate = 0.001, prefix = "t-hops:" }, proxy_hops = 2 },
    apikey = { limiter = redis { capacity = 1, rate = 0.001, prefix = "t-apikey:" },
        key = "header:X-API-Key" },
    fn = { limiter = redis { capacity = 1, rate = 0.001, prefix = "t-fn:" },
        key = function()
            if ngx.var.arg_exempt then
                return nil
            end
            return ngx.var.arg_k
        end },
    memory = { limiter = hirate.new { capacity = 3, rate = 0.001 }, key = "var:arg_k" },
    -- Several limits on one key, one decision: the limiter's options, made
    -- by limit{} itself, with names of their own (no deny cache, so that
    -- every request is one script call) ...
    bands = { limiter = { url = url, prefix = "t-bands:", deny_cache = false, limits = {
        { capacity = 2, rate = 0.5, name = "burst" }, { capacity = 3, rate = 0.001,
            name = "daily" } } }, key = "var:arg_k" },
    -- A reset made elsewhere is seen within deny_cache_max: a limiter's
    -- options through limit{}.
    reset_seen = { limiter = { url = url, prefix = "t-reset:", capacity = 5, rate = 0.0001,
        deny_cache_max = 0.5 }, key = "var:arg_k" },
    -- ... or a limit string and the core's names.
    bands_text = { limiter = redis { limits = "2/4s; 3/1000s", prefix = "t-btext:" },
        key = "var:arg_k", legacy_headers = true },
    -- A policy's name is a band's: several bands cannot take one.
    bands_named = { limiter = redis { limits = "2/4s; 3/1000s", prefix = "t-bnamed:" },
        key = "var:arg_k", name = "api" },
    -- The headers of every case, which test_nginx.py parses as Structured
    -- Fields: a burst band on a daily one, through Redis or decided by each
    -- failure policy (nothing listens at the dead port).
    sf = { limiter = redis { limits = "2/minute; 1000/day", prefix = "t-sf:" },
        key = "var:arg_k", legacy_headers = true },
    sf_open = { limiter = { url = "redis://127.0.0.1:" .. dead, limits = "2/minute; 1000/day",
        on_error = "open" }, key = "var:arg_k", legacy_headers = true },
    sf_closed = { limiter = { url = "redis://127.0.0.1:" .. dead, limits = "2/minute",
        on_error = "closed" }, key = "var:arg_k", legacy_headers = true },
    sf_local = { limiter = { url = "redis://127.0.0.1:" .. dead, limits = "2/minute; 1000/day",
        on_error = "local" }, key = "var:arg_k", legacy_headers = true },
    -- Client management: only failed logins are charged (deduct_when), the
    -- limiter's deny_cache, max_keys and pool_size given through limit{};
    -- a limit on POST requests only; one keyed by address.
    login = { limiter = { url = url, prefix = "t-login:", capacity = 3, rate = 0.0001,
        deny_cache = false, max_keys = 1000, pool_size = 4 }, key = "var:arg_k",
        deduct_when = function(status) return status >= 400 end },
    posts = { limiter = { url = url, prefix = "t-posts:", capacity = 1, rate = 0.0001,
        deny_cache = false }, key = "var:arg_k", methods = "POST" },
    by_addr = { limiter = { url = url, prefix = "t-byaddr:", capacity = 2, rate = 0.0001,
        deny_cache = false } },
    -- The certificate is for localhost: the name checked, while the
    -- cosocket connects to the address (no resolver needed).
    exact_tls = { limiter = redis { url = tls_url, tls_server_name = "localhost",
        capacity = 20, rate = 0.001, prefix = "t-exact:" }, key = "var:arg_k" },
}

-- Limiters called directly (location /call/<name>).
local direct = {
    plain = limits.exact.limiter,
    many = redis { capacity = 5, rate = 0.001, prefix = "t-many:" },
    auth_good = redis { url = "redis://hirate:s3cr3t-good-canary@127.0.0.1:" .. port .. "/2",
        capacity = 5, rate = 1, prefix = "t-auth:" },
    auth_bad = redis { url = "redis://hirate:wrong-canary-pw@127.0.0.1:" .. port .. "/2",
        capacity = 5, rate = 1, prefix = "t-auth:" },
    unix = redis { url = "unix://" .. unix, capacity = 5, rate = 0.001, prefix = "t-unix:" },
    -- Its own database, so its own pool, whose connections CLIENT LIST shows
    -- as db=3.
    readonly = redis { url = "redis://127.0.0.1:" .. port .. "/3", capacity = 5, rate = 0.001,
        prefix = "t-ro:", on_error = "open" },
    memory = limits.memory.limiter,
    dead = redis { url = "redis://127.0.0.1:" .. dead, capacity = 5, rate = 1,
        prefix = "t-dead:", on_error = "closed" },
    trickle = redis { url = "redis://127.0.0.1:" .. trickle, capacity = 5, rate = 1,
        prefix = "t-trickle:", on_error = "open", timeout = 1 },
    tls = redis { url = tls_url, tls_server_name = "localhost", capacity = 5, rate = 0.001,
        prefix = "t-tls:" },
    -- The same server and prefix over its plain port: another pool, never
    -- one of the TLS limiter's connections.
    tls_plain = redis { url = "redis://127.0.0.1:" .. tls_plain_port, capacity = 5,
        rate = 0.001, prefix = "t-tls:" },
    mtls = redis { url = "rediss://127.0.0.1:" .. mtls_port, tls_server_name = "localhost",
        tls_cert_file = certs .. "/client.crt", tls_key_file = certs .. "/client.key",
        capacity = 5, rate = 0.001, prefix = "t-mtls:" },
    -- No check at all (the address is fine then): for tests only.
    unverified = redis { url = "rediss://127.0.0.1:" .. bad_ports.selfsigned,
        tls_verify = false, capacity = 5, rate = 0.001, prefix = "t-unverified:" },
    tls_exact_plain = redis { url = "redis://127.0.0.1:" .. tls_plain_port, capacity = 20,
        rate = 0.001, prefix = "t-exact:" },
    -- A user who may touch t-acl:ok:* only.
    acl = redis { url = "redis://somekeys:pw-somekeys@127.0.0.1:" .. port, capacity = 5,
        rate = 0.001, prefix = "t-acl:", deny_cache = false },
}

-- The misconfigurations, each under every policy: direct["<case>_<policy>"].
local misconfigured = {
    wronghost = { url = "rediss://127.0.0.1:" .. bad_ports.wronghost,
        tls_server_name = "localhost" },
    expired = { url = "rediss://127.0.0.1:" .. bad_ports.expired, tls_server_name = "localhost" },
    selfsigned = { url = "rediss://127.0.0.1:" .. bad_ports.selfsigned,
        tls_server_name = "localhost" },
    -- The right server, the wrong name: "certificate host mismatch".
    badname = { url = tls_url, tls_server_name = "wrong.invalid" },
    -- Mutual TLS without a client certificate.
    nocert = { url = "rediss://127.0.0.1:" .. mtls_port, tls_server_name = "localhost" },
    plain_to_tls = { url = "redis://127.0.0.1:" .. tls_port },
    tls_to_plain = { url = "rediss://127.0.0.1:" .. tls_plain_port,
        tls_server_name = "localhost" },
    maxclients = { url = "redis://127.0.0.1:" .. maxclients_port },
    -- Over TLS Redis cannot say it: it closes during the TLS handshake.
    maxclients_tls = { url = "rediss://127.0.0.1:" .. maxclients_tls_port,
        tls_server_name = "localhost" },
}
for name, o in pairs(misconfigured) do
    for _, policy in ipairs { "local", "open", "closed" } do
        direct[name .. "_" .. policy] = redis { url = o.url, tls_server_name = o.tls_server_name,
            capacity = 5, rate = 1, prefix = "t-" .. name .. ":", on_error = policy,
            connect_timeout = 0.5, timeout = 0.5 }
    end
end

-- Every test limit but "memory" leaves its decision in ngx.ctx, for mark().
for name, opts in pairs(limits) do
    opts.ctx = name ~= "memory" or nil
end

function M.limit(name)
    if ngx.var.arg_raises then
        local ok, err = pcall(resty.limit, limits[name])
        ngx.say(ok and "no error" or tostring(err))
        return ngx.exit(ngx.HTTP_OK)
    end
    return resty.limit(limits[name])
end

function M.login()
    if ngx.var.arg_pw ~= "ok" then
        ngx.status = 401
        ngx.say("no")
        return
    end
    ngx.say("welcome")
end

function M.client(name)
    local client = ngx.var.arg_addr and { address = ngx.var.arg_addr } or { key = ngx.var.arg_k }
    if ngx.var.arg_op == "reset" then
        local ok, err = resty.reset(limits[name], client)
        ngx.say(json.encode({ ok = ok, err = err }))
        return
    end
    local d, err
    if ngx.var.arg_op == "refund" then
        d, err = resty.refund(limits[name], client, tonumber(ngx.var.arg_tokens))
    else
        d, err = resty.peek(limits[name], client)
    end
    ngx.say(json.encode(d and { allowed = d.allowed, remaining = d.remaining } or { err = err }))
end

function M.address(name)
    ngx.say(resty.client_address(limits[name]))
end

-- Marks every response with the worker and, when a limit ran, its decision.
function M.mark()
    ngx.header["X-Worker"] = ngx.worker.pid()
    local d = ngx.ctx.hirate
    if d then
        ngx.header["X-Hirate-Source"] = d.source
        ngx.header["X-Hirate-Error"] = d.error
    end
end

-- Numbers travel as strings: dkjson writes numbers with tostring, which
-- LuaJIT rounds to 14 digits, and the vectors go up to 2^53. Seconds are
-- written with 17 digits, which read back as the same double.
local function int(n)
    return string.format("%.0f", n)
end

local function seconds(s)
    if s == math.huge then
        return "never"
    end
    return string.format("%.17g", s)
end

-- band: 0-based, as the vectors number bands (the binding's is 1-based);
-- bands: each band's figures, with its name, when the decision has them.
local function plain_decision(d)
    local out = {
        allowed = d.allowed, remaining = int(d.remaining), limit = int(d.limit),
        retry_after = seconds(d.retry_after), reset_after = seconds(d.reset_after),
        source = d.source, error = d.error, band = d.band and d.band - 1,
    }
    if d.bands then
        out.bands = {}
        for i, b in ipairs(d.bands) do
            out.bands[i] = plain_decision(b)
            out.bands[i].name = b.name
        end
    end
    return out
end

-- An item of allow_many: its decision, or its error.
local function outcome(d)
    if d.message then
        return { allowed = d.allowed, error = d.error, message = d.message }
    end
    return plain_decision(d)
end

local function reply(t)
    ngx.header["Content-Type"] = "application/json"
    ngx.say(json.encode(t))
end

-- Runs f and answers {ok = true, value} / {ok = false, err, code} /
-- {raised = message}.
local function answer(f)
    local ok, a, b, c = pcall(f)
    if not ok then
        return reply { raised = tostring(a) }
    end
    if a == nil then
        return reply { ok = false, err = b, code = c }
    end
    return reply { ok = true, value = a }
end

function M.call(name)
    local lim = direct[name]
    local op, key = ngx.var.arg_op or "allow", ngx.var.arg_k or "k"
    answer(function()
        if op == "allow" or op == "peek" or op == "refund" then
            ngx.update_time()
            local started = ngx.now()
            local d, err, code = lim[op](lim, key, tonumber(ngx.var.arg_cost))
            ngx.update_time()
            ngx.header["X-Took"] = string.format("%.3f", ngx.now() - started)
            return d and plain_decision(d), err, code
        elseif op == "reset" then
            return lim:reset(key)
        elseif op == "many" then
            local items = { { key, 1 }, { key, 2 }, { key .. "-b", 5 } }
            if ngx.var.arg_bad then
                items[2][1] = ""
            elseif ngx.var.arg_acl then
                items = { { "ok:" .. key, 2 }, { "no:" .. key, 1 }, { "ok:" .. key, 1 } }
            end
            local ds, err, code = lim:allow_many(items)
            if not ds then
                return nil, err, code
            end
            for i, d in ipairs(ds) do
                ds[i] = outcome(d)
            end
            return ds
        elseif op == "burst" then
            -- n calls in a row: each one's code, or its decision's source.
            local out = {}
            for i = 1, tonumber(ngx.var.arg_n) do
                local d, _, code = lim:allow(key)
                out[i] = d and d.source or code
            end
            return out
        elseif op == "tostring" then
            return tostring(lim)
        elseif op == "closed" then
            local l = redis { capacity = 1, rate = 1 }
            l:close()
            l:close()
            local d, err, code = l:allow(key)
            return d, err, code
        elseif op == "twice" then
            -- The second call meets the breaker the first one opened; the
            -- connections tried meanwhile.
            local before = lim:stats().connects
            local first, second = lim:allow(key), lim:allow(key)
            return { plain_decision(first), plain_decision(second),
                lim:stats().connects - before }
        elseif op == "badopts" then
            local out = {}
            local function try(f, ...)
                local ok, err = pcall(f, ...)
                out[#out + 1] = ok and "no error" or tostring(err)
            end
            local l = limits.exact.limiter
            try(resty.limit, { limiter = l, keyy = "remote_addr" })
            try(resty.limit, { limiter = {} })
            try(resty.limit, { limiter = 5 })
            try(resty.limit, { limiter = l, key = "cookie:x" })
            try(resty.limit, { limiter = l, cost = -1 })
            try(resty.limit, { limiter = l, cost = "2" })
            try(resty.limit, { limiter = l, status = 200 })
            try(resty.limit, { limiter = l, name = "caf\195\169" })
            try(resty.limit, { limiter = l, trusted_proxies = { "10.0.0.0/33" } })
            try(resty.limit, { limiter = l, proxy_hops = 65 })
            try(hirate.new, { capacity = 1, rate = 1, keepalive_timeout = -1 })
            try(hirate.new, { capacity = 1, rate = 1, backlog = 0 })
            try(hirate.new, { capacity = 1, rate = 1, pool_sise = 4 })
            try(hirate.new, { url = tls_url, capacity = 1, rate = 1,
                tls_ca_file = certs .. "/ca.crt" })
            try(hirate.new, { url = tls_url, capacity = 1, rate = 1, tls_ca_dir = certs })
            try(hirate.new, { url = tls_url, capacity = 1, rate = 1 })
            try(hirate.new, { url = tls_url, capacity = 1, rate = 1,
                tls_cert_file = certs .. "/nothing.crt", tls_key_file = certs .. "/client.key" })
            return out
        elseif op == "badcost" then -- (not tail calls, which would hide this line)
            local d = lim:allow(key, 1.5)
            return d
        elseif op == "badkey" then
            local d = lim:peek(("x"):rep(513))
            return d
        elseif op == "badclient" then -- raised in hirate/resty/limit.lua
            local d = resty.refund(limits.bands, "nobody")
            return d
        end
        error("unknown op " .. op)
    end)
end

-- The same call from a phase without cosockets: the error it raises.
function M.phase_error(name)
    local lim = direct[name or "plain"]
    local ok, err = pcall(lim.allow, lim, "phase")
    return ok and "no error" or err
end

-- Runs allow from a timer (cosockets work there) and waits for it.
function M.from_timer()
    local result
    local key = "timer-" .. ngx.var.request_id -- no ngx.var in a timer
    local ok, err = ngx.timer.at(0, function()
        local okc, d, msg = pcall(direct.plain.allow, direct.plain, key)
        result = not okc and tostring(d) or d and d.source or msg
    end)
    if not ok then
        return ngx.say("timer: ", err)
    end
    for _ = 1, 300 do
        if result then
            break
        end
        ngx.sleep(0.01)
    end
    ngx.say(result or "no result")
end

---------------------------------------------------------------------------
-- The shared test vectors, through the OpenResty path: each step is a real
-- cosocket round trip with the time injected (_decide_at -> _op_start).

local function hex_bytes(h)
    return (h:gsub("%x%x", function(x)
        return string.char(tonumber(x, 16))
    end))
end

local function vector_key(k)
    if type(k) == "string" then
        return k
    elseif k["repeat"] then
        return k["repeat"]:rep(k.times)
    end
    return hex_bytes(k.hex)
end

local RATES = { nan = 0 / 0, inf = math.huge, ["-inf"] = -math.huge }

function M.vectors()
    local deny_cache = ngx.var.arg_deny_cache == "1"
    local f = assert(io.open(ngx.var.vectors_path, "rb"))
    local doc = assert(json.decode(f:read("*a")))
    f:close()
    local out = {}
    local over_tls = ngx.var.arg_tls == "1"
    -- A config as hirate.new's options: capacity and rate, or limits.
    local function limiter(config, case)
        local opts = {
            deny_cache = deny_cache,
            prefix = "vec" .. (deny_cache and "1" or "0") .. (over_tls and "t" or "") .. ":"
                .. case.id .. ":",
            url = over_tls and tls_url or nil,
            tls_server_name = over_tls and "localhost" or nil,
        }
        if config.bands then
            opts.limits = {}
            for i, b in ipairs(config.bands) do
                opts.limits[i] = { capacity = b.capacity, rate = RATES[b.rate] or b.rate,
                    name = b.name }
            end
        else
            opts.capacity, opts.rate = config.capacity, RATES[config.rate] or config.rate
        end
        return pcall(redis, opts)
    end
    for _, case in ipairs(doc.cases) do
        local ok, lim = limiter(case.config, case)
        local got = { id = case.id }
        out[#out + 1] = got
        if not ok then
            got.config_error = tostring(lim)
        else
            got.steps = {}
            for i, step in ipairs(case.steps or {}) do
                local key = step.key and vector_key(step.key)
                local r
                if step.op == "reconfigure" then
                    -- A new limiter of the step's config, on the same prefix.
                    lim:close()
                    ok, lim = limiter(step.config, case)
                    r = ok and { reconfigured = true } or { raised = tostring(lim) }
                elseif step.op == "reset" then
                    local done, err, code = lim:reset(key)
                    r = done and { reset = true } or { err = err, code = code }
                else
                    local spend = step.op == "allow"
                    if step.op == "refund" then spend = "refund" end
                    local okc, d, err, code = pcall(lim._decide_at, lim, key, step.cost or 1,
                        spend, step.t_us)
                    if not okc then
                        r = { raised = tostring(d) }
                    elseif not d then
                        r = { err = err, code = code }
                    else
                        r = plain_decision(d)
                    end
                end
                got.steps[i] = r
            end
            lim:close()
        end
    end
    reply(out)
end

return M
