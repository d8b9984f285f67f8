--[[
hirate.client_ip: which client a request comes from, for keying a limit by
client address behind proxies. No nginx needed; the rules are the C
core's (hirate.h, "Client identity"), through hirate.core, the same ones the
Python package's ClientIP uses, so both read the same requests the same way.
This module only checks the types of the options.

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

local core = require "hirate.core"

local format, type, error = string.format, type, error

local _M = {}

--- Compiles the options { trusted_proxies = {...}, proxy_hops = n,
--- forwarded_header = "X-Forwarded-For" | "Forwarded", ipv6_subnet = 64 }
--- (each optional). Raises an error naming a bad one (the core's message).
function _M.compile(opts)
    local list = opts.trusted_proxies
    if type(list) == "string" then
        list = { list }
    end
    if list ~= nil and type(list) ~= "table" then
        error("trusted_proxies must be a list of addresses or networks, got " .. type(list), 2)
    end
    local hops, header, subnet = opts.proxy_hops, opts.forwarded_header, opts.ipv6_subnet
    if hops ~= nil and type(hops) ~= "number" then
        error("proxy_hops must be a number, got " .. type(hops), 2)
    end
    if header ~= nil and type(header) ~= "string" then
        error("forwarded_header must be a string, got " .. type(header), 2)
    end
    if subnet ~= nil and type(subnet) ~= "number" then
        error("ipv6_subnet must be a number, got " .. type(subnet), 2)
    end
    local rules, err = core.client_ip(list or {}, hops or 0, header, subnet or core.IPV6_SUBNET_DEFAULT)
    if not rules then
        error(err, 2)
    end
    return { rules = rules, header = rules:header(), uses_header = rules:uses_header() }
end

--- The client's address as text, from the socket peer (nil, "" or "unix:",
--- as nginx writes it, for a Unix socket) and the configured header's value
--- (nil when absent, or a list of field values), under compiled options c.
--- nil when there is no peer and nothing to believe.
function _M.resolve(c, peer, value)
    if peer == "unix:" then
        peer = nil
    end
    return (c.rules:resolve(peer, value))
end

--- The identity of an address for bucket keys: IPv6 by its network of
--- ipv6_subnet bits ("2001:db8::/64"), anything else as it is.
function _M.key(c, address)
    return (c.rules:key(address))
end

local plain

--- The canonical text of an address (as Python's ipaddress writes it), or
--- nil when s is not one.
function _M.normalize(s)
    if type(s) ~= "string" or s == "" then
        return nil
    end
    plain = plain or core.client_ip({}, 0, nil, 64)
    local text, address = plain:resolve(s)
    return address and text or nil
end

return _M
