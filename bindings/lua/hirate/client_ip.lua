--[[
hirate.client_ip: which client a request comes from, for keying a limit by
client address behind proxies. Pure Lua (5.1-5.4, LuaJIT), no nginx needed.

X-Forwarded-For and Forwarded (RFC 7239) are written by whoever sent the
request, so they are believed only as far as the proxies that appended to
them are trusted:

  * with `trusted_proxies` (addresses or CIDRs, IPv4 or IPv6), and only when
    the socket peer is one of them, the header is walked from the right,
    skipping trusted proxies; the first address that is not one is the client
    (if every entry is trusted, the leftmost is);
  * with `proxy_hops = n` (no list), exactly n proxies are trusted to have
    appended: the client is the n-th entry from the right, and entries further
    left (which the client could have sent itself) are ignored; with both, the
    peer must also be in the list;
  * otherwise, or when the header is missing, too short, or its deciding entry
    is not an address, the socket peer is the client.

Addresses come back in one canonical text form, so that the same client is
one key whatever its spelling: IPv4 as a dotted quad, IPv4-mapped IPv6 as the
IPv4 address, and IPv6 as its /64 network ("2001:db8:0:1::/64") because one
subscriber usually holds a whole /64 and could otherwise pick a fresh address,
and so a fresh bucket, for every request.
]]

local byte, char, find, format, lower, sub, gsub, match =
    string.byte, string.char, string.find, string.format, string.lower, string.sub,
    string.gsub, string.match
local concat, unpack = table.concat, table.unpack or unpack
local floor, tonumber, type, ipairs, error, tostring = math.floor, tonumber, type, ipairs, error,
    tostring

local _M = {}

-- Parses a dotted quad into its 4 bytes. Leading zeros are refused: "010"
-- is 8 to some parsers and 10 to others.
local function parse_v4(s)
    local a, b, c, d = match(s, "^(%d%d?%d?)%.(%d%d?%d?)%.(%d%d?%d?)%.(%d%d?%d?)$")
    if not a then
        return nil
    end
    local parts = { a, b, c, d }
    for i = 1, 4 do
        local p = parts[i]
        if #p > 1 and sub(p, 1, 1) == "0" then
            return nil
        end
        local n = tonumber(p)
        if n > 255 then
            return nil
        end
        parts[i] = n
    end
    return char(parts[1], parts[2], parts[3], parts[4])
end

-- Parses IPv6 text (an embedded IPv4 tail and one "::" allowed, no zone)
-- into its 16 bytes.
local function parse_v6(s)
    if find(s, "[^%x:%.]") or s == "" then
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
    local function groups(part, allow_v4)
        local out = {}
        if part == "" then
            return out
        end
        local fields = {}
        for f in (part .. ":"):gmatch("([^:]*):") do
            fields[#fields + 1] = f
        end
        for i, f in ipairs(fields) do
            if allow_v4 and i == #fields and find(f, ".", 1, true) then
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
    local h = groups(head, tail == nil)
    local t = tail and groups(tail, true) or {}
    if not h or not t then
        return nil
    end
    local n = #h + #t
    if (dc and n > 7) or (not dc and n ~= 8) then
        return nil
    end
    local all = {}
    for _, g in ipairs(h) do
        all[#all + 1] = g
    end
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

local V4_MAPPED = string.rep("\0", 10) .. "\255\255"

-- An address as 16 bytes (IPv4 as IPv4-mapped IPv6), or nil.
local function parse(s)
    local v4 = parse_v4(s)
    if v4 then
        return V4_MAPPED .. v4
    end
    return parse_v6(s)
end

-- Text of 16 bytes: IPv4 for a mapped address, else the /64 network with
-- the longest run of zero groups written "::" (RFC 5952, as Python's
-- ipaddress writes it).
local function canonical(b16)
    if sub(b16, 1, 12) == V4_MAPPED then
        return format("%d.%d.%d.%d", byte(b16, 13, 16))
    end
    local g = {}
    for i = 1, 4 do
        local hi, lo = byte(b16, 2 * i - 1, 2 * i)
        g[i] = hi * 256 + lo
    end
    g[5], g[6], g[7], g[8] = 0, 0, 0, 0
    local best, best_len, run, run_len = nil, 1, nil, 0
    for i = 1, 8 do
        if g[i] == 0 then
            if not run then
                run, run_len = i, 0
            end
            run_len = run_len + 1
            if run_len > best_len then
                best, best_len = run, run_len
            end
        else
            run = nil
        end
    end
    local parts = {}
    local i = 1
    while i <= 8 do
        if i == best then
            parts[#parts + 1] = (i == 1) and ":" or ""
            i = i + best_len
            if i > 8 then
                parts[#parts + 1] = ""
            end
        else
            parts[#parts + 1] = format("%x", g[i])
            i = i + 1
        end
    end
    return concat(parts, ":") .. "/64"
end

-- Strips what may surround an address in a header: quotes, brackets, a port.
local function unwrap(s)
    s = gsub(s, '^%s*"?%s*(.-)%s*"?%s*$', "%1")
    local bracketed = match(s, "^%[([^%]]*)%]") -- [v6] or [v6]:port
    if bracketed then
        return bracketed
    end
    local host = match(s, "^([%d%.]+):%d+$") -- v4:port
    return host or s
end

--- Parses "a.b.c.d", "v6" or either with "/bits" into a matcher entry.
local function parse_cidr(spec)
    if type(spec) ~= "string" then
        return nil, "must be a string, got " .. type(spec)
    end
    local addr, bits = match(spec, "^([^/]+)/(%d+)$")
    addr = addr or spec
    local b = parse(addr)
    if not b then
        return nil, format("%q is not an IP address or CIDR", spec)
    end
    local is_v4 = parse_v4(addr) ~= nil
    local max = is_v4 and 32 or 128
    local n = bits and tonumber(bits) or max
    if n > max then
        return nil, format("%q has a prefix longer than %d bits", spec, max)
    end
    return { bytes = b, bits = is_v4 and n + 96 or n }
end

local function in_net(b16, net)
    local whole = floor(net.bits / 8)
    if sub(b16, 1, whole) ~= sub(net.bytes, 1, whole) then
        return false
    end
    local rest = net.bits - whole * 8
    if rest == 0 then
        return true
    end
    local div = 2 ^ (8 - rest)
    return floor(byte(b16, whole + 1) / div) == floor(byte(net.bytes, whole + 1) / div)
end

--- Compiles a list of trusted proxies (addresses or CIDRs). Raises an error
--- naming the bad entry.
function _M.compile(list)
    if type(list) ~= "table" then
        error("trusted_proxies must be a list of addresses or CIDRs, got " .. type(list), 2)
    end
    local nets = {}
    for i, spec in ipairs(list) do
        local net, why = parse_cidr(spec)
        if not net then
            error(format("trusted_proxies[%d] %s", i, why), 2)
        end
        nets[#nets + 1] = net
    end
    return nets
end

local function trusted(b16, nets)
    for i = 1, #nets do
        if in_net(b16, nets[i]) then
            return true
        end
    end
    return false
end

-- The entries of X-Forwarded-For, leftmost first, unwrapped, as text.
local function xff_entries(value)
    local out = {}
    for item in (value .. ","):gmatch("([^,]*),") do
        out[#out + 1] = unwrap(item)
    end
    return out
end

-- The for= values of Forwarded, leftmost first, one per element ("" for an
-- element without one; "unknown" and obfuscated names stay in, and are not
-- addresses). A quoted value may hold "," and ";".
local function forwarded_entries(value)
    local out, i, n, cur = {}, 1, #value, nil
    while true do
        i = i + #match(value, "^%s*", i)
        if i > n then
            break
        end
        local c = sub(value, i, i)
        if c == "," then
            out[#out + 1] = cur or ""
            cur, i = nil, i + 1
        elseif c == ";" then
            i = i + 1
        else
            local pair = match(value, "^[^=;,%s]+%s*=%s*", i)
            if not pair then
                i = find(value, "[;,]", i) or n + 1 -- not a pair: skip it
            else
                local name = match(pair, "^[^=;,%s]+")
                i = i + #pair
                local v
                if sub(value, i, i) == '"' then
                    local buf, j = {}, i + 1
                    while j <= n and sub(value, j, j) ~= '"' do
                        if sub(value, j, j) == "\\" then
                            j = j + 1
                        end
                        buf[#buf + 1] = sub(value, j, j)
                        j = j + 1
                    end
                    v, i = concat(buf), j + 1
                else
                    local stop = find(value, "[;,%s]", i) or n + 1
                    v, i = sub(value, i, stop - 1), stop
                end
                if cur == nil and lower(name) == "for" then
                    cur = unwrap(v)
                end
            end
        end
    end
    out[#out + 1] = cur or ""
    return out
end

_M.parse = parse
_M.canonical = canonical
_M.xff_entries = xff_entries
_M.forwarded_entries = forwarded_entries

--- The canonical text of an address, or nil when it is not one.
function _M.normalize(text)
    if type(text) ~= "string" then
        return nil
    end
    local b = parse(unwrap(text))
    return b and canonical(b) or nil
end

--- The client address of a request.
---   peer       the socket peer (ngx.var.remote_addr)
---   xff        the X-Forwarded-For value or nil
---   forwarded  the Forwarded value or nil (used when xff is absent)
---   nets       compile()'d trusted proxies or nil
---   hops       proxy_hops or nil
--- Returns the canonical client address; the peer's text as given when the
--- peer itself is not an address (a unix socket peer, say).
function _M.client(peer, xff, forwarded, nets, hops)
    local peer_b = parse(unwrap(peer or ""))
    local peer_text = peer_b and canonical(peer_b) or tostring(peer)
    if not nets and not hops then
        return peer_text
    end
    if nets and not (peer_b and trusted(peer_b, nets)) then
        return peer_text
    end
    local entries
    if xff and xff ~= "" then
        entries = xff_entries(xff)
    elseif forwarded and forwarded ~= "" then
        entries = forwarded_entries(forwarded)
    else
        return peer_text
    end
    if hops then
        local pick = entries[#entries - hops + 1]
        local b = pick and parse(pick)
        return b and canonical(b) or peer_text
    end
    for i = #entries, 1, -1 do
        local b = parse(entries[i])
        if not b then
            return peer_text
        end
        if not trusted(b, nets) or i == 1 then
            return canonical(b)
        end
    end
    return peer_text
end

return _M
