-- Plain Lua over TLS (rediss://), through the core's blocking client, and
-- the misconfigurations that are errors under every policy: a certificate
-- that fails its check, a plain/TLS mismatch, a server at maxclients, an
-- ACL user without a permission. And allow_many, whose items each keep
-- their own outcome when one of them errs.
--
-- The servers are real redis-servers with a plain port (for redis-cli and
-- the mismatches) and a TLS port, presenting the certificates that
-- tests/support/make_certs.sh makes.
local hirate = require "hirate"
local support = require "helpers.support"
local redis_server = require "helpers.redis_server"

local pack = support.pack
local POLICIES = { "local", "open", "closed" }

local function untimed(d)
    assert.is_number(d.time)
    d.time = nil
    return d
end

local function new(opts)
    local o = { capacity = 5, rate = 0.001, timeout = 2, connect_timeout = 2 }
    for k, v in pairs(opts) do
        o[k] = v
    end
    return hirate.new(o)
end

-- Checks that r (pack(lim:allow(...))) is nil, a message with every one of
-- words in it, and code.
local function is_error(r, code, words)
    assert.equal(3, r.n)
    assert.is_nil(r[1], r[1] and r[1].source)
    assert.equal(code, r[3], r[2])
    for _, w in ipairs(words or {}) do
        assert.truthy(r[2]:find(w, 1, true), ("%q not in %q"):format(w, r[2]))
    end
end

describe("over TLS", function()
    local srv, ca
    setup(function()
        srv = redis_server.start({}, { tls = "server" })
        ca = redis_server.certs() .. "/ca.crt"
    end)
    teardown(function()
        if srv then srv:close() end
    end)
    before_each(function()
        srv:cli("FLUSHALL")
    end)

    it("spends exactly the capacity, shared by every limiter of the URL", function()
        local a = new { url = srv.tls_url, tls_ca_file = ca, prefix = "x:", deny_cache = false }
        local b = new { url = srv.tls_url, tls_ca_file = ca, prefix = "x:", deny_cache = false }
        local allowed = 0
        for i = 1, 12 do
            local d = (i % 2 == 0 and a or b):allow("k")
            assert.equal("redis", d.source)
            assert.is_nil(d.error)
            allowed = allowed + (d.allowed and 1 or 0)
        end
        assert.equal(5, allowed)
        -- What Redis holds, read over the plain port: nothing left.
        local plain = new { url = srv.url, prefix = "x:", deny_cache = false }
        assert.same({ false, 0, "redis" }, { plain:peek("k").allowed, plain:peek("k").remaining,
            plain:peek("k").source })
        assert.same(pack(true), pack(a:reset("k")))
        assert.equal(5, plain:peek("k").remaining)
        assert.same({ allowed = true, remaining = 3, limit = 5, retry_after = 0,
            reset_after = 2000, source = "redis" }, untimed(a:allow("k", 2)))
    end)

    it("checks the name the URL gives, or tls_server_name", function()
        -- server.crt is for localhost, 127.0.0.1 and ::1.
        local by_ip = new { url = srv.tls_url, tls_ca_file = ca }
        assert.equal("redis", by_ip:allow("k").source)
        local by_name = new { url = "rediss://localhost:" .. srv.tls_port, tls_ca_file = ca }
        assert.equal("redis", by_name:allow("k").source)
        local named = new { url = srv.tls_url, tls_ca_file = ca, tls_server_name = "localhost" }
        assert.equal("redis", named:allow("k").source)
        for _, policy in ipairs(POLICIES) do
            local wrong = new { url = srv.tls_url, tls_ca_file = ca, on_error = policy,
                tls_server_name = "wrong.invalid" }
            is_error(pack(wrong:allow("k")), "ETLS")
        end
    end)

    it("reads a CA directory, and verifies nothing when told not to", function()
        local dir = redis_server.certs()
        os.execute("cd " .. dir .. " && rm -rf hashed && mkdir hashed && cp ca.crt hashed/ && "
            .. "openssl rehash hashed >/dev/null 2>&1")
        local lim = new { url = srv.tls_url, tls_ca_dir = dir .. "/hashed" }
        assert.equal("redis", lim:allow("k").source)
        -- The test CA is nobody's system CA: only tls_verify = false passes.
        local unverified = new { url = srv.tls_url, tls_verify = false }
        assert.equal("redis", unverified:allow("k").source)
        is_error(pack(new { url = srv.tls_url }:allow("k")), "ETLS")
    end)

    it("decides a batch per item over TLS", function()
        local lim = new { url = srv.tls_url, tls_ca_file = ca, deny_cache = false }
        local ds = lim:allow_many { { "a", 2 }, { "b" }, { "a", 4 } }
        assert.same({ allowed = true, remaining = 3, limit = 5, retry_after = 0,
            reset_after = 2000, source = "redis" }, untimed(ds[1]))
        assert.same({ true, 4 }, { ds[2].allowed, ds[2].remaining })
        assert.same({ false, 3, "redis" }, { ds[3].allowed, ds[3].remaining, ds[3].source })
    end)
end)

describe("mutual TLS", function()
    local srv, dir
    setup(function()
        srv = redis_server.start({}, { tls = "server", auth_clients = "yes" })
        dir = redis_server.certs()
    end)
    teardown(function()
        if srv then srv:close() end
    end)

    it("presents the client certificate", function()
        local lim = new { url = srv.tls_url, tls_ca_file = dir .. "/ca.crt",
            tls_cert_file = dir .. "/client.crt", tls_key_file = dir .. "/client.key" }
        assert.same({ true, 4, "redis" }, { lim:allow("k").allowed, lim:peek("k").remaining,
            lim:peek("k").source })
    end)

    it("refused without a client certificate: ETLS under every policy", function()
        for _, policy in ipairs(POLICIES) do
            local lim = new { url = srv.tls_url, tls_ca_file = dir .. "/ca.crt",
                on_error = policy }
            is_error(pack(lim:allow("k")), "ETLS", { "certificate required" })
            lim:close()
        end
    end)

    it("raises at new for a certificate file that is not there", function()
        support.raises("bad argument #1 to 'new' (tls_cert_file " .. dir .. "/nothing.crt: No "
            .. "such file or directory)", function()
                local _ = hirate.new { url = srv.tls_url, capacity = 1, rate = 1,
                    tls_cert_file = dir .. "/nothing.crt", tls_key_file = dir .. "/client.key" }
            end)
    end)
end)

describe("a certificate that fails its check", function()
    local servers, dir = {}, nil
    setup(function()
        dir = redis_server.certs()
        for _, cert in ipairs { "wronghost", "expired", "selfsigned" } do
            servers[cert] = redis_server.start({}, { tls = cert })
        end
        -- A good certificate, checked against a CA that did not sign it.
        servers["other CA"] = redis_server.start({}, { tls = "server" })
    end)
    teardown(function()
        for _, s in pairs(servers) do
            s:close()
        end
    end)

    for _, cert in ipairs { "wronghost", "expired", "selfsigned", "other CA" } do
        it(("is ETLS under every policy (%s), soon, with few connections"):format(cert),
            function()
                local srv = servers[cert]
                local ca = dir .. (cert == "other CA" and "/other-ca.crt" or "/ca.crt")
                for _, policy in ipairs(POLICIES) do
                    -- A wait for a timeout would take 5 s.
                    local lim = new { url = srv.tls_url, tls_ca_file = ca, on_error = policy,
                        connect_timeout = 5, timeout = 5 }
                    local t0 = support.now()
                    for _ = 1, 10 do
                        is_error(pack(lim:allow("k")), "ETLS")
                    end
                    is_error(pack(lim:reset("k")), "ETLS")
                    local ds = lim:allow_many { { "k", 1 } }
                    assert.same({ false, "ETLS" }, { ds[1].allowed, ds[1].error })
                    local elapsed = support.now() - t0
                    assert.is_true(elapsed < 3, "ETLS should not wait for a timeout")
                    -- A handful of attempts, not one a call: the core's backoff
                    -- waits 10 ms (-25%) after the first failure and doubles, so
                    -- that n attempts take at least 7.5 ms * (2^(n-1) - 1); one
                    -- more for the time the handshakes take (long under
                    -- valgrind). (Counted by the limiter: Redis counts no
                    -- connection whose TLS handshake failed.)
                    local attempts = lim:_stats().connects
                    local most = 2 + math.log(1 + elapsed / 0.0075, 2)
                    assert.is_true(attempts >= 1 and attempts <= most, attempts .. " > " .. most)
                    lim:close()
                end
            end)
    end
end)

describe("a plain/TLS mismatch", function()
    local srv, ca
    setup(function()
        srv = redis_server.start({}, { tls = "server" })
        ca = redis_server.certs() .. "/ca.crt"
    end)
    teardown(function()
        if srv then srv:close() end
    end)

    for _, policy in ipairs(POLICIES) do
        -- connect_timeout 2 s: a quarter of it is the probe's (room for a
        -- TLS handshake under valgrind).
        it("is ETLS under on_error = '" .. policy .. "': redis:// to a TLS port", function()
            local lim = new { url = "redis://127.0.0.1:" .. srv.tls_port, on_error = policy }
            local t0 = support.now()
            is_error(pack(lim:allow("k")), "ETLS", { "rediss://" })
            -- The server resets at once: no timeout waited for.
            assert.is_true(support.now() - t0 < 1.5, support.now() - t0)
            is_error(pack(lim:allow("k")), "ETLS", { "rediss://" })
        end)

        it("is ETLS under on_error = '" .. policy .. "': rediss:// to a plain port", function()
            local lim = new { url = "rediss://127.0.0.1:" .. srv.port, tls_ca_file = ca,
                on_error = policy }
            local t0 = support.now()
            is_error(pack(lim:allow("k")), "ETLS", { "redis://" })
            -- The TLS handshake's 1.5 s without an answer, then the probe.
            local took = support.now() - t0
            assert.is_true(took >= 1.4 and took < 3, took)
        end)
    end
end)

describe("a server at maxclients", function()
    local srv, holder
    setup(function()
        srv = redis_server.start({ "--maxclients", "1" }, { tls = "server" })
        -- One limiter holds the one connection Redis allows, pooled.
        holder = new { url = srv.url, pool_size = 1 }
        assert.equal("redis", holder:allow("hold").source)
    end)
    teardown(function()
        if holder then holder:close() end
        if srv then srv:close() end
    end)

    it("is EREFUSED under every policy", function()
        for _, policy in ipairs(POLICIES) do
            local lim = new { url = srv.url, on_error = policy }
            is_error(pack(lim:allow("k")), "EREFUSED",
                { "refused the connection: ERR max number of clients reached" })
            local ds = lim:allow_many { { "k", 1 }, { "j", 1 } }
            assert.same({ false, "EREFUSED", false, "EREFUSED" },
                { ds[1].allowed, ds[1].error, ds[2].allowed, ds[2].error })
            lim:close()
        end
    end)

    it("is an outage over TLS, where Redis can only close the connection", function()
        -- Redis checks maxclients before the TLS handshake, and cannot send
        -- its error in clear to a TLS client: the server closed the
        -- connection mid-handshake, which is what a failing server does.
        local want = { ["local"] = "local", open = "fail_open", closed = "fail_closed" }
        for _, policy in ipairs(POLICIES) do
            local lim = new { url = srv.tls_url, tls_ca_file = redis_server.certs() .. "/ca.crt",
                on_error = policy }
            local d = lim:allow("k")
            assert.same({ want[policy], "EIO" }, { d.source, d.error })
            lim:close()
        end
    end)
end)

describe("an ACL user", function()
    local srv, ca
    setup(function()
        srv = redis_server.start({}, { tls = "server" })
        ca = redis_server.certs() .. "/ca.crt"
        -- No script commands for one; keys under rl:ok: only for the other.
        assert.equal("OK", srv:cli("ACL", "SETUSER", "noscript", "on", ">pw-noscript", "~*",
            "+@all", "-evalsha", "-eval", "-fcall", "-fcall_ro"))
        assert.equal("OK", srv:cli("ACL", "SETUSER", "somekeys", "on", ">pw-somekeys",
            "~rl:ok:*", "+@all"))
    end)
    teardown(function()
        if srv then srv:close() end
    end)

    for _, transport in ipairs { "plain", "tls" } do
        local function url(user)
            local port = transport == "tls" and srv.tls_port or srv.port
            return ("%s://%s:pw-%s@127.0.0.1:%d"):format(transport == "tls" and "rediss"
                or "redis", user, user, port)
        end

        it("without the script's command is ENOPERM under every policy (" .. transport .. ")",
            function()
                for _, policy in ipairs(POLICIES) do
                    local lim = new { url = url("noscript"), tls_ca_file = transport == "tls"
                        and ca or nil, on_error = policy }
                    is_error(pack(lim:allow("k")), "ENOPERM", { "NOPERM" })
                    local r = pack(lim:allow("k"))
                    is_error(r, "ENOPERM")
                    assert.is_nil(r[2]:find("pw-noscript", 1, true), r[2])
                    lim:close()
                end
            end)

        it("refused one key of a batch: the others keep their decisions (" .. transport .. ")",
            function()
                srv:cli("FLUSHALL")
                local lim = new { url = url("somekeys"), tls_ca_file = transport == "tls"
                    and ca or nil, deny_cache = false }
                local ds = lim:allow_many { { "ok:a", 2 }, { "no:b", 1 }, { "ok:c", 1 },
                    { "ok:a", 1 } }
                assert.equal(4, #ds)
                assert.same({ allowed = true, remaining = 3, limit = 5, retry_after = 0,
                    reset_after = 2000, source = "redis" }, untimed(ds[1]))
                assert.equal("ENOPERM", ds[2].error)
                assert.is_false(ds[2].allowed)
                assert.truthy(ds[2].message:find("NOPERM", 1, true), ds[2].message)
                assert.is_nil(ds[2].source)
                assert.same({ true, 4 }, { ds[3].allowed, ds[3].remaining })
                assert.same({ true, 2 }, { ds[4].allowed, ds[4].remaining })
                -- What Redis holds agrees, read by the default user.
                local admin = new { url = srv.url, deny_cache = false }
                assert.equal(2, admin:peek("ok:a").remaining)
                assert.equal(4, admin:peek("ok:c").remaining)
                assert.equal(5, admin:peek("no:b").remaining)
                assert.equal("0", srv:cli("EXISTS", "rl:no:b"))
                -- The same key alone: nil, message, code.
                is_error(pack(lim:allow("no:b")), "ENOPERM", { "NOPERM" })
            end)
    end
end)
