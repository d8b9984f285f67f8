-- lim:check(): the core's health check as a Lua table, against a real
-- redis-server before and after its first decision, one that was killed,
-- one that wants another password (never shown), a replica, and a limiter
-- without Redis.
local hirate = require "hirate"
local redis_server = require "helpers.redis_server"

local function new(url, extra)
    local opts = { url = url, capacity = 5, rate = 1, prefix = "chk:", timeout = 2,
        connect_timeout = 2 }
    for k, v in pairs(extra or {}) do
        opts[k] = v
    end
    return hirate.new(opts)
end

describe("lim:check()", function()
    it("finds no node and is healthy without Redis", function()
        local lim = new(nil)
        assert.same({ ok = true, nodes = {} }, lim:check())
        lim:close()
        assert.same({ nil, "limiter is closed", "ECLOSED" }, { lim:check() })
    end)

    describe("against a live Redis", function()
        local srv
        before_each(function() srv = redis_server.start() end)
        after_each(function() srv:close() end)

        for _, functions in ipairs { true, false } do
            it("says what is loaded before and after the first decision (functions = "
                .. tostring(functions) .. ")", function()
                local lim = new(srv.url, { functions = functions })
                local h = lim:check()
                assert.is_true(h.ok)
                assert.equal(1, #h.nodes)
                local node = h.nodes[1]
                assert.is_number(node.latency)
                node.latency = nil
                assert.same({ addr = "127.0.0.1:" .. srv.port, ok = true, message = "",
                    role = "master", functions = functions, loaded = false }, node)
                assert.truthy(lim:allow("k"))
                local before = lim:stats()
                h = lim:check()
                assert.same({ true, functions, true },
                    { h.ok, h.nodes[1].functions, h.nodes[1].loaded })
                assert.same(before, lim:stats()) -- not a decision
                lim:close()
            end)
        end

        it("reports a killed server as ECONNECT, with what is unknown left out", function()
            local lim = new(srv.url)
            srv:kill()
            local h = lim:check()
            assert.same({ false, "ECONNECT" }, { h.ok, h.error })
            local node = h.nodes[1]
            assert.truthy(node.message:find("127.0.0.1:" .. srv.port, 1, true))
            node.message = nil
            assert.same({ addr = "127.0.0.1:" .. srv.port, ok = false, error = "ECONNECT" }, node)
            lim:close()
        end)

        it("reports a replica as ESERVER", function()
            local replica = redis_server.start { "--replicaof", "127.0.0.1", tostring(srv.port) }
            local lim = new(replica.url)
            local h = lim:check()
            assert.same({ false, "ESERVER", "slave" }, { h.ok, h.error, h.nodes[1].role })
            assert.equal("Redis at 127.0.0.1:" .. replica.port .. " is not a master (ROLE: "
                .. "slave): it cannot take decisions", h.nodes[1].message)
            lim:close()
            replica:close()
        end)
    end)

    it("reports a wrong password as EAUTH, never showing it", function()
        local srv = redis_server.start { "--requirepass", "right-pw-4e1" }
        local lim = new("redis://:wrong-pw-77a@127.0.0.1:" .. srv.port)
        local h = lim:check()
        assert.same({ false, "EAUTH", "EAUTH" }, { h.ok, h.error, h.nodes[1].error })
        assert.truthy(h.nodes[1].message:find("WRONGPASS", 1, true))
        assert.falsy(h.nodes[1].message:find("wrong-pw-77a", 1, true))
        lim:close()
        srv:close()
    end)
end)
