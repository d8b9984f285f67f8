-- hirate.client_ip: the client address behind proxies, by the rules of the
-- Python package's ClientIP (bindings/python/hirate/_http.py). Pure Lua:
-- runs under Lua 5.4 and LuaJIT (tests/lua/nginx/run.sh).
local client_ip = require "hirate.client_ip"

local function resolve(opts, peer, value)
    return client_ip.resolve(client_ip.compile(opts), peer, value)
end

describe("hirate.client_ip", function()
    describe("normalize writes an address as Python's ipaddress does", function()
        local cases = {
            { "192.0.2.1", "192.0.2.1" }, { " 192.0.2.1 ", "192.0.2.1" },
            { "192.0.2.1:8080", "192.0.2.1" }, { "192.0.2.1:_obf", "192.0.2.1" },
            { "2001:DB8:0:0:0:0:0:1", "2001:db8::1" }, { "[2001:db8::1]:443", "2001:db8::1" },
            { '"[2001:db8::1]:443"', "2001:db8::1" }, { "1:0:0:1:0:0:0:1", "1:0:0:1::1" },
            { "1:0:0:0:1:0:0:1", "1::1:0:0:1" }, { "1:0:1:0:1:0:1:0", "1:0:1:0:1:0:1:0" },
            { "::", "::" }, { "::ffff:192.0.2.9", "192.0.2.9" }, { "::1.2.3.4", "::102:304" },
            { "010.0.0.1", nil }, { "256.0.0.1", nil }, { "1.2.3", nil },
            { "1:2:3:4:5:6:7:8:9", nil }, { "1::2::3", nil }, { "unknown", nil },
            { "_hidden", nil }, { "", nil }, { "192.0.2.1:123456", nil }, { "[2001:db8::1", nil },
            { "2001:db8::1:80", "2001:db8::1:80" },
        }
        for _, c in ipairs(cases) do
            it(("%q -> %s"):format(c[1], tostring(c[2])), function()
                assert.equal(c[2], client_ip.normalize(c[1]))
            end)
        end
    end)

    describe("key: the identity of an address", function()
        local default = client_ip.compile({})
        it("is an IPv4 address itself", function()
            assert.equal("192.0.2.1", client_ip.key(default, "192.0.2.1"))
        end)
        it("is the /64 of an IPv6 address", function()
            assert.equal("2001:db8:1:2::/64", client_ip.key(default, "2001:db8:1:2:3:4:5:6"))
        end)
        it("follows ipv6_subnet", function()
            local c48 = client_ip.compile({ ipv6_subnet = 48 })
            assert.equal("2001:db8:1::/48", client_ip.key(c48, "2001:db8:1:2:3:4:5:6"))
            local c128 = client_ip.compile({ ipv6_subnet = 128 })
            assert.equal("2001:db8:1:2:3:4:5:6", client_ip.key(c128, "2001:db8:1:2:3:4:5:6"))
            local c60 = client_ip.compile({ ipv6_subnet = 60 })
            assert.equal("2001:db8:1:fff0::/60", client_ip.key(c60, "2001:db8:1:ffff::1"))
        end)
        it("leaves what is not an address as it is", function()
            assert.equal("unix:", client_ip.key(default, "unix:"))
        end)
    end)

    describe("resolve", function()
        local trusted = { trusted_proxies = { "10.0.0.0/8", "127.0.0.1", "2001:db8::/32" } }
        -- options, peer, header value, client
        local cases = {
            { "no configuration: the peer, whatever the header says",
              {}, "127.0.0.1", "1.1.1.1", "127.0.0.1" },
            { "an untrusted peer's header is ignored",
              trusted, "9.9.9.9", "1.1.1.1", "9.9.9.9" },
            { "a trusted peer: from the right, past trusted proxies",
              trusted, "127.0.0.1", "6.6.6.6, 1.1.1.1, 10.1.2.3", "1.1.1.1" },
            { "every hop trusted: the leftmost",
              trusted, "127.0.0.1", "10.0.0.9, 10.0.0.8", "10.0.0.9" },
            { "a hop that is no address ends the walk at the nearest address to its right",
              trusted, "127.0.0.1", "1.1.1.1, unknown, 10.0.0.5", "10.0.0.5" },
            { "garbage right at the peer: the peer",
              trusted, "127.0.0.1", "1.1.1.1, garbage", "127.0.0.1" },
            { "IPv6 proxies and clients",
              trusted, "2001:db8::1", "2001:db9::5, 2001:db8::2", "2001:db9::5" },
            { "an empty header: the peer",
              trusted, "127.0.0.1", "", "127.0.0.1" },
            { "hops: the n-th from the right, whatever is left of it",
              { proxy_hops = 2 }, "127.0.0.1", "6.6.6.6, 1.1.1.1, 2.2.2.2", "1.1.1.1" },
            { "hops: fewer hops than proxies means the peer",
              { proxy_hops = 2 }, "127.0.0.1", "2.2.2.2", "127.0.0.1" },
            { "hops: garbage among the trusted hops ends at the nearest address",
              { proxy_hops = 3 }, "127.0.0.1", "6.6.6.6, 1.1.1.1, junk, 2.2.2.2", "2.2.2.2" },
            { "hops with a list: the peer must be trusted too",
              { proxy_hops = 1, trusted_proxies = { "10.0.0.0/8" } }, "127.0.0.1", "1.1.1.1",
              "127.0.0.1" },
            { "Forwarded: the for= of each element, quoted, bracketed, with ports",
              { trusted_proxies = { "127.0.0.1" }, forwarded_header = "Forwarded" }, "127.0.0.1",
              'for=192.0.2.60;proto=http;by=203.0.113.43, For="[2001:db8:cafe::17]:4711"',
              "2001:db8:cafe::17" },
            { "Forwarded: an element without for= is no address",
              { proxy_hops = 1, forwarded_header = "forwarded" }, "127.0.0.1",
              "for=192.0.2.60, by=10.0.0.1", "127.0.0.1" },
            { "Forwarded: commas and semicolons inside quotes belong to the value",
              { proxy_hops = 2, forwarded_header = "Forwarded" }, "127.0.0.1",
              'for="1.1.1.1";x="a,b;c", for=2.2.2.2', "1.1.1.1" },
            { "Forwarded: an unterminated quote makes the last hop garbage",
              { proxy_hops = 1, forwarded_header = "Forwarded" }, "127.0.0.1",
              'for=1.1.1.1, for="2.2.2.2', "127.0.0.1" },
            { "a Unix socket peer, trusted as \"unix\"",
              { trusted_proxies = { "unix" } }, "unix:", "1.1.1.1", "1.1.1.1" },
            { "a Unix socket peer, not trusted: no address",
              { trusted_proxies = { "10.0.0.0/8" } }, "unix:", "1.1.1.1", nil },
            { "an IPv4-mapped peer is IPv4",
              trusted, "::ffff:10.0.0.1", "1.1.1.1", "1.1.1.1" },
        }
        for _, c in ipairs(cases) do
            it(c[1], function()
                assert.equal(c[5], resolve(c[2], c[3], c[4]))
            end)
        end
    end)

    describe("compile refuses bad options, naming them", function()
        local EXAMPLE = "(e.g. '10.0.0.0/8', '::1', 'unix')"
        local cases = {
            { { trusted_proxies = { "10.0.0.0/33" } },
              "trusted_proxies: \"10.0.0.0/33\" is not an address or network " .. EXAMPLE },
            { { trusted_proxies = { "proxy.local" } },
              "trusted_proxies: \"proxy.local\" is not an address or network " .. EXAMPLE },
            { { trusted_proxies = 7 },
              "trusted_proxies must be a list of addresses or networks, got number" },
            { { proxy_hops = -1 }, "proxy_hops must be a whole number from 0 to 64, got -1" },
            { { proxy_hops = 1.5 }, "proxy_hops must be a whole number from 0 to 64, got 1.5" },
            { { forwarded_header = "X-Real-IP" },
              "forwarded_header must be 'X-Forwarded-For' or 'Forwarded', got \"X-Real-IP\"" },
            { { ipv6_subnet = 0 }, "ipv6_subnet must be a prefix length from 1 to 128, got 0" },
        }
        for _, c in ipairs(cases) do
            it(c[2], function()
                local ok, err = pcall(client_ip.compile, c[1])
                assert.is_false(ok)
                assert.equal(c[2], (tostring(err):gsub("^[^\n]-:%d+: ", "")))
            end)
        end
    end)
end)
