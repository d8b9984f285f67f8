-- Plain Lua over a Redis Cluster (redis+cluster://, rediss+cluster://): the
-- core's blocking client routes every key to its slot's master, so the Lua
-- module needs nothing of its own for it. Real clusters of 3 masters, each
-- with a replica, started by tests/support/redis_cluster.py.
local hirate = require "hirate"
local support = require "helpers.support"
local redis_server = require "helpers.redis_server"

---------------------------------------------------------------------------
-- The cluster: the harness' command line, its commands on our pipe to its
-- stdin (closing the pipe, or this process dying, stops the cluster), its
-- answers in a file read back here.

local function quote(s)
    return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

local function read_all(path)
    local f = io.open(path, "rb")
    if not f then
        return ""
    end
    local s = f:read("*a")
    f:close()
    return s
end

local Cluster = {}
Cluster.__index = Cluster

-- The answer file's lines, once it has count of them (nil after seconds).
function Cluster:lines(count, seconds)
    for _ = 1, seconds * 20 do
        local lines = {}
        for line in read_all(self.out):gmatch("([^\n]*)\n") do
            lines[#lines + 1] = line
        end
        if #lines >= count or read_all(self.out):find("Traceback", 1, true) then
            return #lines >= count and lines or nil
        end
        support.sleep(0.05)
    end
end

local function start_cluster(tls_dir)
    local self = setmetatable({ out = os.tmpname(), answers = 1 }, Cluster)
    local cmd = { support.python, quote(support.root .. "/tests/support/redis_cluster.py"),
        "start", "--masters", "3", "--replicas", "1" }
    if tls_dir then
        cmd[#cmd + 1] = "--tls " .. quote(tls_dir)
    end
    self.pipe = assert(io.popen(table.concat(cmd, " ") .. " >" .. quote(self.out) .. " 2>&1",
        "w"))
    local lines = self:lines(1, 60)
    if not lines or not lines[1]:match("^{") then
        local out = read_all(self.out)
        self:close()
        error("the cluster did not start: " .. out)
    end
    local line = lines[1]
    self.url = assert(line:match('"url":%s*"([^"]+)"'), line)
    self.nodes = {}
    for obj in line:gmatch('{[^{}]*"port"[^{}]*}') do
        local node = { port = tonumber(obj:match('"port":%s*(%d+)')),
            role = obj:match('"role":%s*"(%a+)"'), slots = {} }
        for lo, hi in obj:gmatch("%[(%d+),%s*(%d+)%]") do
            node.slots[#node.slots + 1] = { tonumber(lo), tonumber(hi) }
        end
        self.nodes[#self.nodes + 1] = node
    end
    return self
end

--- One harness command; its answer line.
function Cluster:command(...)
    self.pipe:write(table.concat({ ... }, " "), "\n")
    self.pipe:flush()
    self.answers = self.answers + 1
    return assert(self:lines(self.answers, 60), "no answer")[self.answers]
end

--- The nodes as the cluster sees them now (roles change in a failover):
-- the harness' "nodes" answers "ok N" and then a line a node (port pid role id
-- master-id slots state).
function Cluster:refresh()
    self.pipe:write("nodes\n")
    self.pipe:flush()
    local head = assert(self:lines(self.answers + 1, 60), "no answer")[self.answers + 1]
    local count = assert(tonumber(head:match("^ok (%d+)")), head)
    local lines = assert(self:lines(self.answers + 1 + count, 60), "no answer")
    self.nodes = {}
    for i = self.answers + 2, self.answers + 1 + count do
        local port, role, slots = lines[i]:match("^(%d+) %d+ (%a+) %S+ %S+ (%S+) %a+$")
        local node = { port = tonumber(port), role = role, slots = {} }
        for lo, hi in slots:gmatch("(%d+)-(%d+)") do
            node.slots[#node.slots + 1] = { tonumber(lo), tonumber(hi) }
        end
        self.nodes[#self.nodes + 1] = node
    end
    self.answers = self.answers + 1 + count
end

function Cluster:ports(role)
    self:refresh()
    local out = {}
    for _, n in ipairs(self.nodes) do
        if n.role == role then
            out[#out + 1] = n.port
        end
    end
    table.sort(out)
    return out
end

local function hex(s)
    return "x" .. s:gsub(".", function(c) return ("%02x"):format(c:byte()) end)
end

--- The port of the master whose slots hold each of keys (full Redis keys),
-- by Redis' own CLUSTER KEYSLOT.
function Cluster:master_ports(keys)
    local words = { "keyslot" }
    for i, k in ipairs(keys) do
        words[i + 1] = hex(k)
    end
    local ports = {}
    for slot in self:command(table.concat(words, " ")):gmatch("%d+") do
        slot = tonumber(slot)
        for _, n in ipairs(self.nodes) do
            for _, r in ipairs(n.role == "master" and n.slots or {}) do
                if slot >= r[1] and slot <= r[2] then
                    ports[#ports + 1] = n.port
                end
            end
        end
    end
    return ports
end

function Cluster:close()
    if self.pipe then
        self.pipe:close()   -- end of input: the harness stops the cluster and exits
        self.pipe = nil
    end
    os.remove(self.out)
end

---------------------------------------------------------------------------

local CAPACITY = 3

local function new(opts)
    local o = { capacity = CAPACITY, rate = 0.001, deny_cache = false, timeout = 5,
        connect_timeout = 5 }
    for k, v in pairs(opts) do
        o[k] = v
    end
    return hirate.new(o)
end

-- Every key gets exactly CAPACITY allowed, then a refusal, each decided by
-- Redis; returns how many decisions were made.
local function exact(lim, keys)
    local made = 0
    for _, key in ipairs(keys) do
        for i = 1, CAPACITY + 1 do
            local d, err, code = lim:allow(key)
            assert(d, ("%s: %s (%s)"):format(key, tostring(err), tostring(code)))
            assert.equal("redis", d.source, key)
            assert.equal(i <= CAPACITY, d.allowed, key .. " call " .. i)
            assert.equal(i <= CAPACITY and CAPACITY - i or 0, d.remaining, key)
            made = made + 1
        end
    end
    return made
end

local function keys_of(tag, n)
    local keys = {}
    for i = 1, n do
        keys[i] = tag .. i
    end
    return keys
end

describe("a Redis Cluster from plain Lua", function()
    local c
    setup(function()
        c = start_cluster()
    end)
    teardown(function()
        if c then c:close() end
    end)

    it("gives 1,000 keys over every master each exactly its capacity, decided by Redis",
        function()
        local lim = new { url = c.url, prefix = "a:" }
        local keys = keys_of("k", 1000)
        local full = {}
        for i, k in ipairs(keys) do
            full[i] = "a:" .. k
        end
        -- The keys reach every master (the slot ranges of all three).
        local seen, count = {}, 0
        assert.equal(1000, #c:master_ports(full))
        for _, p in ipairs(c:master_ports(full)) do
            if not seen[p] then
                seen[p], count = true, count + 1
            end
        end
        assert.equal(3, count)
        assert.equal(4000, exact(lim, keys))
        assert.equal("redis", lim:peek("k1").source)
        lim:close()
    end)

    it("answers allow_many across the nodes in the caller's order", function()
        local lim = new { url = c.url, prefix = "b:" }
        local items = {}
        for i = 1, 30 do
            items[i] = { "m" .. i, i % 3 + 1 }   -- costs 1, 2, 3 over keys of every node
        end
        local first = assert(lim:allow_many(items))
        local second = assert(lim:allow_many(items))
        assert.equal(30, #first)
        for i, it in ipairs(items) do
            local cost = it[2]
            assert.equal("redis", first[i].source, it[1])
            assert.is_true(first[i].allowed, it[1])
            assert.equal(CAPACITY - cost, first[i].remaining, it[1])
            -- The second batch: what is left of each bucket decides.
            assert.equal("redis", second[i].source, it[1])
            assert.equal(2 * cost <= CAPACITY, second[i].allowed, it[1])
            assert.equal(2 * cost <= CAPACITY and CAPACITY - 2 * cost or CAPACITY - cost,
                second[i].remaining, it[1])
        end
        lim:close()
    end)

    it("works with a replica as its only seed", function()
        local replica = c:ports("replica")[1]
        local lim = new { url = "redis+cluster://127.0.0.1:" .. replica, prefix = "c:" }
        assert.equal(400, exact(lim, keys_of("r", 100)))
        lim:close()
    end)

    it("spends one bucket from every limiter of the cluster", function()
        local a = new { url = c.url, prefix = "d:" }
        local b = new { url = "redis+cluster://127.0.0.1:" .. c:ports("master")[3], prefix = "d:" }
        for i = 1, CAPACITY do
            assert.is_true(((i % 2 == 0) and a or b):allow("shared").allowed)
        end
        assert.is_false(a:allow("shared").allowed)
        assert.is_false(b:allow("shared").allowed)
        a:close()
        b:close()
    end)
end)

describe("a Redis Cluster over TLS from plain Lua", function()
    local c, ca
    setup(function()
        local certs = redis_server.certs()
        ca = certs .. "/ca.crt"
        c = start_cluster(certs)
    end)
    teardown(function()
        if c then c:close() end
    end)

    it("gives 300 keys each exactly its capacity (rediss+cluster://)", function()
        assert.truthy(c.url:match("^rediss%+cluster://localhost:"), c.url)
        local lim = new { url = c.url, tls_ca_file = ca, prefix = "t:" }
        assert.equal(1200, exact(lim, keys_of("s", 300)))
        local ds = assert(lim:allow_many { { "s1" }, { "s2" }, { "s3" } })
        for i = 1, 3 do
            assert.equal("redis", ds[i].source)
            assert.is_false(ds[i].allowed)
        end
        lim:close()
    end)
end)

---------------------------------------------------------------------------
-- The hooks of the OpenResty path (hirate/resty.lua), driven here through
-- tests/lua/helpers/resp_relay.py: one round trip to a port a call.

local relay_file = os.tmpname()

local function relay(port, bytes)
    local f = assert(io.open(relay_file, "wb"))
    f:write(bytes)
    f:close()
    local p = assert(io.popen(support.python .. " -S "
        .. quote(support.root .. "/tests/lua/helpers/resp_relay.py") .. " " .. port .. " < "
        .. quote(relay_file), "r"))
    local out = p:read("*a")
    p:close()
    return out
end

-- Runs op's rounds as resty.lua does: every leg to its node, its replies
-- fed back, then next(). Returns the number of legs of each round.
local function rounds(lim, op)
    local legs = {}
    repeat
        local n = op:legs()
        legs[#legs + 1] = n
        local nodes = {}
        for leg = 1, n do
            local node = op:leg_node(leg)
            assert.is_nil(nodes[node])   -- at most one leg a node
            nodes[node] = true
            local ep = assert(lim:_endpoint(node))
            local replies = relay(ep.port, op:leg_request(leg))
            local state, used = op:leg_feed(leg, replies)
            assert.equal("done", state)
            assert.equal(#replies, used)   -- no byte nobody asked for
            assert.is_false(op:leg_drop(leg))
        end
    until op:next() ~= "send"
    return legs
end

describe("the op hooks over a Redis Cluster", function()
    local c
    setup(function()
        c = start_cluster()
    end)
    teardown(function()
        if c then c:close() end
        os.remove(relay_file)
    end)

    it("run a batch in rounds of legs, one a node, and answer in order", function()
        local lim = new { url = c.url, prefix = "o:" }
        assert.is_true(lim:_is_cluster())
        assert.is_false(new({ url = "redis://127.0.0.1:1" }):_is_cluster())
        local items = {}
        for i = 1, 30 do
            items[i] = { "o" .. i, 2 }
        end
        local op = assert(lim:_op_start(items, true))
        support.raises("bad argument #1 to 'leg_node' (the round has no leg 0 (it has "
            .. op:legs() .. "))", function() op:leg_node(0) end)
        local legs = rounds(lim, op)
        -- Some round had a leg on each of the three masters.
        local most = 0
        for _, n in ipairs(legs) do
            most = math.max(most, n)
        end
        assert.equal(3, most)
        assert.equal(0, op:legs())
        assert.equal("done", op:next())
        for i, d in ipairs(op:results()) do
            assert.same({ true, 1, "redis" }, { d.allowed, d.remaining, d.source }, items[i][1])
        end
        op:free()
        -- The blocking client sees the same buckets.
        assert.same({ false, 1, "redis" }, (function()
            local d = lim:allow("o1", 2)
            return { d.allowed, d.remaining, d.source }
        end)())
        lim:close()
    end)

    it("name every node's endpoint, and refuse a node never named", function()
        local lim = new { url = c.url }
        local ep = assert(lim:_endpoint())
        assert.equal(ep.where, assert(lim:_endpoint(0)).where)
        local r = support.pack(lim:_endpoint(255))
        assert.same({ 3, nil, "the limiter has no node 255", "EINVAL" }, { r.n, r[1], r[2], r[3] })
        support.raises("bad argument #1 to '_endpoint' (node must be from 0 to 255, got 256)",
            function() lim:_endpoint(256) end)
        local hs = assert(lim:_handshake_start(0))
        hs:free()
        lim:close()
    end)
end)

