--- A throwaway redis-server for the busted specs.
--
--     local redis_server = require "helpers.redis_server"
--     local srv = redis_server.start()            -- or start{"--requirepass", "pw"}
--     srv.url, srv.port, srv.dir, srv.pid
--     srv:cli("SET", "k", "v")  --> "OK"          -- redis-cli, one command
--     srv:stop() / srv:cont()                     -- SIGSTOP / SIGCONT: it hangs
--     srv:kill()                                  -- SIGKILL: connections refused
--     srv:restart()                               -- again, on the same port
--     srv:relay(bytes)                            -- one round trip (resp_relay.py)
--     srv:close()                                 -- kill it and remove its directory
--
--     local tls = redis_server.start({}, { tls = "server" })   -- TLS as well
--     tls.tls_url, tls.tls_port   -- rediss://127.0.0.1:<port>; srv.port stays plain,
--                                 -- for redis-cli and for the mismatch tests
--     redis_server.certs()        -- the directory of tests/support/make_certs.sh
--     -- tls = "wronghost", "expired" or "selfsigned": the server presents that
--     -- certificate; auth_clients = "yes": mutual TLS (client.crt, client.key)
--
-- Plain Lua has no sockets, so the server is our own child through io.popen,
-- run under `setpriv --pdeathsig KILL`: if the test process dies, even in a
-- crash, the kernel kills the server with it. Commands go through redis-cli.
-- A port is chosen at random and the server's own process id is checked
-- through INFO, so that a port another server holds is never mistaken for
-- ours (the start is retried on another port).

local M = {}
M.__index = M

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."

-- The relay starts once a request: support.python starts fast.
local python = require("helpers.support").python

local function quote(s)
    return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

local function run(cmd)
    local f = assert(io.popen(cmd .. " 2>&1", "r"))
    local out = f:read("*a")
    f:close()
    return out
end

local support = require "helpers.support"

local certs_dir

--- The TLS material of tests/support/make_certs.sh (ca.crt, server.crt,
-- client.crt ...), made once a process into a directory under $TMPDIR.
function M.certs()
    if not certs_dir then
        local dir = run("mktemp -d \"${TMPDIR:-/tmp}/hirate-lua-certs.XXXXXX\""):gsub("%s+$", "")
        local out = run("sh " .. quote(support.root .. "/tests/support/make_certs.sh") .. " "
            .. quote(dir))
        local f = io.open(dir .. "/done")
        assert(f, "make_certs.sh failed: " .. out)
        f:close()
        certs_dir = dir
    end
    return certs_dir
end

local function sleep(s)
    os.execute("sleep " .. s)
end

local seeded = false
local function random_port()
    if not seeded then
        -- Two test processes started in the same second must not agree.
        local f = io.open("/dev/urandom", "rb")
        local b = f:read(4)
        f:close()
        math.randomseed(b:byte(1) * 16777216 + b:byte(2) * 65536 + b:byte(3) * 256 + b:byte(4))
        seeded = true
    end
    return math.random(20000, 60999)
end

function M:cli(...)
    local args = { "redis-cli", "-p", tostring(self.port), "--no-auth-warning" }
    if self.password then
        args[#args + 1] = "-a"
        args[#args + 1] = quote(self.password)
    end
    for _, a in ipairs({ ... }) do
        args[#args + 1] = quote(a)
    end
    return (run(table.concat(args, " ")):gsub("\n$", ""))
end

-- os.execute returns true (5.2 and later) or 0 (5.1, LuaJIT) for success.
local function succeeds(cmd)
    local r = os.execute(cmd)
    return r == true or r == 0
end

function M:alive()
    return succeeds("kill -0 " .. self.pid .. " 2>/dev/null")
end

-- Starts the server on self.port; true when it answers as our own process.
function M:spawn()
    local cmd = { "echo $$; exec setpriv --pdeathsig KILL redis-server",
        "--port", self.port, "--bind 127.0.0.1", "--save ''", "--appendonly no",
        "--dir", quote(self.dir), "--logfile", quote(self.dir .. "/redis.log"),
        "--unixsocket", quote(self.dir .. "/redis.sock"), "--unixsocketperm 700",
        "--enable-debug-command local" }
    if self.tls then
        local dir = M.certs()
        for _, a in ipairs { "--tls-port", self.tls_port,
            "--tls-cert-file", dir .. "/" .. self.tls .. ".crt",
            "--tls-key-file", dir .. "/" .. self.tls .. ".key",
            "--tls-ca-cert-file", dir .. "/ca.crt",
            "--tls-auth-clients", self.auth_clients or "no" } do
            cmd[#cmd + 1] = quote(a)
        end
    end
    for _, a in ipairs(self.extra) do
        cmd[#cmd + 1] = quote(a)
    end
    self.proc = assert(io.popen(table.concat(cmd, " "), "r"))
    self.pid = tonumber(self.proc:read("*l"))
    for _ = 1, 100 do
        local info = self:cli("INFO", "server")
        local pid = tonumber(info:match("process_id:(%d+)"))
        if pid == self.pid then
            return true
        end
        if (pid and pid ~= self.pid) or not self:alive() then
            break   -- the port is someone else's
        end
        sleep(0.05)
    end
    self:kill()
    return false
end

--- Starts a server; extra is a list of more redis-server arguments; opts.tls
-- names the certificate of a TLS port as well (see above).
function M.start(extra, opts)
    opts = opts or {}
    local self = setmetatable({ extra = extra or {}, tls = opts.tls,
        auth_clients = opts.auth_clients }, M)
    for i = 1, #self.extra - 1 do
        if self.extra[i] == "--requirepass" then
            self.password = self.extra[i + 1]
        end
    end
    self.dir = run("mktemp -d \"${TMPDIR:-/tmp}/hirate-lua-redis.XXXXXX\""):gsub("%s+$", "")
    for _ = 1, 5 do
        self.port = random_port()
        if self.tls then
            repeat
                self.tls_port = random_port()
            until self.tls_port ~= self.port
            self.tls_url = "rediss://127.0.0.1:" .. self.tls_port
        end
        if self:spawn() then
            self.url = "redis://127.0.0.1:" .. self.port
            self.socket = self.dir .. "/redis.sock"
            return self
        end
    end
    os.execute("rm -rf " .. quote(self.dir))
    error("redis-server did not start (is it installed and on PATH?)", 2)
end

function M:stop()
    os.execute("kill -STOP " .. self.pid)
end

function M:cont()
    os.execute("kill -CONT " .. self.pid)
end

function M:kill()
    if self.proc then
        os.execute("kill -KILL " .. self.pid .. " 2>/dev/null")
        self.proc:close()   -- reaps it
        self.proc = nil
    end
end

function M:restart()
    self:kill()
    assert(self:spawn(), "redis-server did not restart on port " .. self.port)
end

function M:close()
    self:kill()
    os.execute("rm -rf " .. quote(self.dir))
end

--- Sends bytes over one new connection and returns every reply's bytes.
function M:relay(bytes)
    local path = self.dir .. "/request"
    local f = assert(io.open(path, "wb"))
    f:write(bytes)
    f:close()
    local p = assert(io.popen(python .. " -S " .. quote(here .. "/resp_relay.py") .. " " .. self.port
        .. " < " .. quote(path), "r"))
    local out = p:read("*a")
    p:close()
    return out
end

return M
