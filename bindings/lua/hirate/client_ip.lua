--[[
hirate.client_ip: which client a request comes from, for keying a limit by
client address behind proxies. Pure Lua (5.1-5.4, LuaJIT), no nginx needed;
the rules are those of the Python package (bindings/python/hirate/_http.py,
ClientIP), so both read the same requests the same way.

Without configuration the client is the socket peer. The header proxies add
(X-Forwarded-For by default, or Forwarded, RFC 7239) is written by whoever
sent the request, so it is believed only when the peer is a proxy of ours:

  * trusted_proxies: addresses or networks ("10.0.0.0/8", "::1", and "unix"
    for a peer on a Unix socket). When the peer is one, the header is walked
    from the right, skipping addresses that are trusted proxies too; the
    first other address is the client.
  * proxy_hops = n: n proxies append to the header, so the client is the
    n-th address from the right, whatever a client wrote to the left of it.
    With trusted_proxies as well, the peer must also be one of them.

A hop that is not an address ("unknown", garbage) ends the walk: the client
is then the nearest address to its right (a proxy of ours), never a value the
client could have chosen. A request with fewer hops than proxy_hops did not
come through the proxies: its peer is the client. IPv4-mapped IPv6 addresses
are read as IPv4.

Addresses are written as Python's ipaddress writes them (IPv6 compressed as
RFC 5952 says), and key() gives the identity of an address for a bucket:
IPv6 clients by their /64 network (configurable), since one subscriber
usually holds a whole /64 and could otherwise take a fresh bucket for every
request.
]]

local byte, char, find, format, lower, sub, match =
    string.byte, string.char, string.find, string.format, string.lower, string.sub,
    string.match
local concat, unpack = table.concat, table.unpack or unpack
local floor, tonumber, tostring, type, ipairs, select, error = math.floor, tonumber, tostring,
    type, ipairs, select, error

local _M = {}

local V4_MAPPED = string.rep("\0", 10) .. "\255\255"

-- A dotted quad as 4 bytes. Leading zeros are refused, as Python does:
-- "010" is 8 to some parsers and 10 to others.
local function parse_v4(s)
    local a, b, c, d = match(s, "^(%d+)%.(%d+)%.(%d+)%.(%d+)$")
    if not a then
        return nil
    end
    local parts = { a, b, c, d }
    for i = 1, 4 do
        local p = parts[i]
        if #p > 3 or (#p > 1 and sub(p, 1, 1) == "0") or tonumber(p) > 255 then
            return nil
        end
        parts[i] = tonumber(p)
    end
    return char(parts[1], parts[2], parts[3], parts[4])
end

-- The groups of one side of "::" (an IPv4 tail allowed where tail_ok), or
-- nil.
local function groups(part, tail_ok, out)
    if part == "" then
        return out
    end
    local fields = {}
    for f in (part .. ":"):gmatch("([^:]*):") do
        fields[#fields + 1] = f
    end
    for i, f in ipairs(fields) do
        if tail_ok and i == #fields and find(f, ".", 1, true) then
            local v4 = parse_v4(f)
            if not v4 then
                return nil
            end
            local b1, b2, b3, b4 = byte(v4, 1, 4)
            out[#out + 1] = b1 * 256 + b2
            out[#out + 1] = b3 * 256 + b4
        elseif match(f, "^%x%x?%x?%x?$") then
            out[#out + 1] = tonumber(f, 16)
        else
            return nil
        end
    end
    return out
end

-- IPv6 text (one "::" and an IPv4 tail allowed, no zone) as 16 bytes.
local function parse_v6(s)
    if s == "" or find(s, "[^%x:%.]") then
        return nil
    end
    local head, tail = s, nil
    local dc = find(s, "::", 1, true)
    if dc then
        head, tail = sub(s, 1, dc - 1), sub(s, dc + 2)
        if find(tail, "::", 1, true) then
            return nil
        end
    end
    local h = groups(head, tail == nil, {})
    local t = tail and groups(tail, true, {}) or {}
    if not h or not t then
        return nil
    end
    local n = #h + #t
    if (dc and n > 7) or (not dc and n ~= 8) then
        return nil
    end
    local all = h
    for _ = 1, 8 - n do
        all[#all + 1] = 0
    end
    for _, g in ipairs(t) do
        all[#all + 1] = g
    end
    local bytes = {}
    for i = 1, 8 do
        bytes[2 * i - 1] = floor(all[i] / 256)
        bytes[2 * i] = all[i] % 256
    end
    return char(unpack(bytes))
end

-- An address as 16 bytes, IPv4 (and IPv4-mapped IPv6) as ::ffff:a.b.c.d.
local function parse_ip(s)
    local v4 = parse_v4(s)
    if v4 then
        return V4_MAPPED .. v4
    end
    return parse_v6(s)
end

local function is_v4(b16)
    return sub(b16, 1, 12) == V4_MAPPED
end

-- The 16 bytes with all but the first `bits` bits cleared.
local function network(b16, bits)
    local whole = floor(bits / 8)
    local out = sub(b16, 1, whole)
    local rest = bits - whole * 8
    if rest > 0 and whole < 16 then
        local div = 2 ^ (8 - rest)
        out = out .. char(floor(byte(b16, whole + 1) / div) * div)
        whole = whole + 1
    end
    return out .. string.rep("\0", 16 - whole)
end

-- Text of 16 bytes: a dotted quad for IPv4, else IPv6 with the longest run
-- (the first of equal ones) of two or more zero groups written "::".
local function text(b16)
    if is_v4(b16) then
        return format("%d.%d.%d.%d", byte(b16, 13, 16))
    end
    local g = {}
    for i = 1, 8 do
        local hi, lo = byte(b16, 2 * i - 1, 2 * i)
        g[i] = hi * 256 + lo
    end
    local best, best_len, run = nil, 1, 0
    for i = 1, 8 do
        run = g[i] == 0 and run + 1 or 0
        if run > best_len then
            best, best_len = i - run + 1, run
        end
    end
    for i = 1, 8 do
        g[i] = format("%x", g[i])
    end
    if not best then
        return concat(g, ":")
    end
    return concat(g, ":", 1, best - 1) .. "::" .. concat(g, ":", best + best_len, 8)
end

-- One hop of X-Forwarded-For, or the for= of a Forwarded element, as 16
-- bytes: "192.0.2.1", "192.0.2.1:80", "[2001:db8::1]:443", "2001:db8::1",
-- quoted or not; nil when it is not an address.
local function valid_port(s)
    return match(s, "^:%d%d?%d?%d?%d?$") or match(s, "^:_[%w%._%-]+$")
end

local function parse_node(s)
    s = match(s, "^%s*(.-)%s*$")
    if #s >= 2 and sub(s, 1, 1) == '"' and sub(s, -1) == '"' then
        s = sub(s, 2, -2):gsub('\\"', '"'):gsub("\\\\", "\\")
        s = match(s, "^%s*(.-)%s*$")
    end
    local host
    if sub(s, 1, 1) == "[" then
        local close = find(s, "]", 1, true)
        if not close then
            return nil
        end
        host = sub(s, 2, close - 1)
        local rest = sub(s, close + 1)
        if rest ~= "" and not valid_port(rest) then
            return nil
        end
    elseif select(2, s:gsub(":", "")) == 1 then
        local colon = find(s, ":", 1, true)
        if not valid_port(sub(s, colon)) then
            return nil
        end
        host = sub(s, 1, colon - 1)
    else
        host = s
    end
    return parse_ip(host)
end

-- The for= of each element of a Forwarded value, left to right ("" for an
-- element without one); "," and ";" inside quoted strings belong to them.
local function forwarded_fors(value)
    local out = {}
    local element_for, param, buf, quoted = "", nil, {}, false
    local n = #value
    local i = 1
    while i <= n + 1 do
        local c = i <= n and sub(value, i, i) or ","
        if quoted and i <= n then
            buf[#buf + 1] = c
            if c == "\\" and i < n then
                buf[#buf + 1] = sub(value, i + 1, i + 1)
                i = i + 1
            elseif c == '"' then
                quoted = false
            end
        elseif c == '"' then
            quoted = true
            buf[#buf + 1] = c
        elseif c == "=" and param == nil then
            param, buf = lower(match(concat(buf), "^%s*(.-)%s*$")), {}
        elseif c == ";" or c == "," then
            if param == "for" then
                local v = match(concat(buf), "^%s*(.-)%s*$")
                if v ~= "" then
                    element_for = v
                end
            end
            param, buf = nil, {}
            if c == "," then
                out[#out + 1] = element_for
                element_for = ""
            end
        else
            buf[#buf + 1] = c
        end
        i = i + 1
    end
    if quoted then -- an unterminated quoted string: the last hop is garbage
        out[#out] = ""
    end
    return out
end

local function xff_hops(value)
    local out = {}
    for hop in (value .. ","):gmatch("([^,]*),") do
        out[#out + 1] = hop
    end
    return out
end

local function trusted(b16, nets)
    if not b16 then
        return false
    end
    for i = 1, #nets do
        local net = nets[i]
        if network(b16, net.bits) == net.bytes then
            return true
        end
    end
    return false
end

--- Compiles the options { trusted_proxies = {...}, proxy_hops = n,
--- forwarded_header = "X-Forwarded-For" | "Forwarded", ipv6_subnet = 64 }
--- (each optional). Raises an error naming a bad one.
function _M.compile(opts)
    local c = { nets = {}, trust_unix = false, hops = 0, header = "X-Forwarded-For",
        subnet = 64 }
    local list = opts.trusted_proxies
    if type(list) == "string" then
        list = { list }
    end
    if list ~= nil and type(list) ~= "table" then
        error("trusted_proxies must be a list of addresses or networks, got " .. type(list), 2)
    end
    for _, entry in ipairs(list or {}) do
        local spec = type(entry) == "string" and match(entry, "^%s*(.-)%s*$")
        if spec and lower(spec) == "unix" then
            c.trust_unix = true
        else
            local addr, bits = match(spec or "", "^([^/]+)/(%d+)$")
            local b = parse_ip(addr or spec or "")
            local v4 = b and parse_v4(addr or spec) ~= nil
            local max = v4 and 32 or 128
            bits = bits and tonumber(bits) or max
            if not b or bits > max then
                error(format("trusted_proxies: %s is not an address or network "
                    .. "(e.g. '10.0.0.0/8', '::1', 'unix')",
                    type(entry) == "string" and format("%q", entry) or type(entry)), 2)
            end
            bits = v4 and bits + 96 or bits
            c.nets[#c.nets + 1] = { bytes = network(b, bits), bits = bits }
        end
    end
    local hops = opts.proxy_hops
    if hops ~= nil then
        if type(hops) ~= "number" or hops ~= floor(hops) or hops < 0 or hops > 64 then
            error("proxy_hops must be a whole number from 0 to 64, got " .. tostring(hops), 2)
        end
        c.hops = hops
    end
    local header = opts.forwarded_header
    if header ~= nil then
        local h = type(header) == "string" and lower(header)
        if h ~= "x-forwarded-for" and h ~= "forwarded" then
            error(format("forwarded_header must be 'X-Forwarded-For' or 'Forwarded', got %s",
                type(header) == "string" and format("%q", header) or type(header)), 2)
        end
        c.header = h == "forwarded" and "Forwarded" or "X-Forwarded-For"
    end
    local subnet = opts.ipv6_subnet
    if subnet ~= nil then
        if type(subnet) ~= "number" or subnet ~= floor(subnet) or subnet < 1 or subnet > 128 then
            error("ipv6_subnet must be a prefix length from 1 to 128, got " .. tostring(subnet),
                2)
        end
        c.subnet = subnet
    end
    c.uses_header = #c.nets > 0 or c.trust_unix or c.hops > 0
    return c
end

--- The client's address as text, from the socket peer (nil, "" or "unix:"
--- for a Unix socket) and the configured header's value (nil when absent),
--- under compiled options c. nil when there is no peer and nothing to
--- believe.
function _M.resolve(c, peer, value)
    if peer == "" or peer == "unix:" then
        peer = nil
    end
    local peer_b = peer and parse_node(peer)
    local peer_text = peer_b and text(peer_b) or peer
    if not c.uses_header or not value or value == "" then
        return peer_text
    end
    local peer_trusted
    if peer then
        peer_trusted = trusted(peer_b, c.nets)
    else
        peer_trusted = c.trust_unix
    end
    if (#c.nets > 0 or c.trust_unix) and not peer_trusted then
        return peer_text
    end
    local hops = c.header == "Forwarded" and forwarded_fors(value) or xff_hops(value)
    local n = #hops
    if c.hops > 0 then
        if n < c.hops then
            return peer_text
        end
        local nearest = peer_text
        for i = n, n - c.hops + 2, -1 do
            local b = parse_node(hops[i])
            if not b then
                return nearest
            end
            nearest = text(b)
        end
        local b = parse_node(hops[n - c.hops + 1])
        return b and text(b) or nearest
    end
    local nearest = peer_text
    for i = n, 1, -1 do
        local b = parse_node(hops[i])
        if not b then
            return nearest
        end
        if not trusted(b, c.nets) then
            return text(b)
        end
        nearest = text(b)
    end
    return nearest
end

--- The identity of an address for bucket keys: IPv6 by its network of
--- c.subnet bits ("2001:db8::/64"), anything else as it is.
function _M.key(c, address)
    if address == nil then
        return nil
    end
    local b = parse_ip(address)
    if not b then
        return address
    end
    if not is_v4(b) and c.subnet < 128 then
        return text(network(b, c.subnet)) .. "/" .. c.subnet
    end
    return text(b)
end

--- The canonical text of an address (as Python's ipaddress writes it), or
--- nil when s is not one.
function _M.normalize(s)
    local b = type(s) == "string" and parse_node(s)
    return b and text(b) or nil
end

_M.forwarded_fors = forwarded_fors

return _M
