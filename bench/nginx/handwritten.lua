--[[
The comparison for bench/nginx: the same limit as hirate's, written the way
an OpenResty user writes it without hirate (Debian has no lua-resty-redis,
so the few lines of RESP that library would hide are here): a cosocket from
a keepalive pool, EVALSHA of hirate's own script with the same arguments,
EVAL when Redis answers NOSCRIPT, 429 when refused, allowed when Redis
fails. Every request is a round trip; nothing is remembered.
]]

local _M = {}

local script, sha

--- Reads the script once per worker (init_worker_by_lua*).
function _M.init(path)
    local f = assert(io.open(path, "rb"))
    script = f:read("*a")
    f:close()
    sha = (ngx.sha1_bin(script):gsub(".", function(c)
        return string.format("%02x", c:byte())
    end))
end

local function command(args)
    local out = { "*" .. #args .. "\r\n" }
    for i = 1, #args do
        local a = tostring(args[i])
        out[#out + 1] = "$" .. #a .. "\r\n" .. a .. "\r\n"
    end
    return table.concat(out)
end

-- One RESP reply: a number, a string, an array, or nil and the error.
local function read_reply(sock)
    local line, err = sock:receive()
    if not line then
        return nil, err
    end
    local kind, rest = line:sub(1, 1), line:sub(2)
    if kind == ":" then
        return tonumber(rest)
    elseif kind == "$" then
        local n = tonumber(rest)
        if n < 0 then
            return ngx.null
        end
        local data
        data, err = sock:receive(n + 2)
        return data and data:sub(1, n), err
    elseif kind == "*" then
        local t = {}
        for i = 1, tonumber(rest) do
            local v
            v, err = read_reply(sock)
            if v == nil then
                return nil, err
            end
            t[i] = v
        end
        return t
    elseif kind == "+" then
        return rest
    end
    return nil, rest -- "-ERR ..."
end

--- Spends 1 token of key's bucket; refuses with 429 when it lacks one.
function _M.limit(host, port, prefix, capacity, rate, key)
    local sock = ngx.socket.tcp()
    sock:settimeouts(250, 100, 100)
    local ok, err = sock:connect(host, port, { pool = "handwritten", pool_size = 16 })
    if not ok then
        ngx.log(ngx.ERR, "redis: ", err)
        return -- Redis is down: let the request through
    end
    local args = { "EVALSHA", sha, 1, prefix .. key, capacity, rate, 1, 1 }
    sock:send(command(args))
    local reply
    reply, err = read_reply(sock)
    if reply == nil and err and err:find("^NOSCRIPT") then
        args[1], args[2] = "EVAL", script
        sock:send(command(args))
        reply, err = read_reply(sock)
    end
    if type(reply) ~= "table" then
        ngx.log(ngx.ERR, "redis: ", err)
        sock:close()
        return
    end
    sock:setkeepalive(60000, 16)
    if reply[1] ~= 1 then
        return ngx.exit(429)
    end
end

return _M
