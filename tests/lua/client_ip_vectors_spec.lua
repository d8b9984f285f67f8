-- Client identity (docs/semantics.md, "Client addresses and keys") through
-- hirate.client_ip and hirate.core: every case of tests/vectors/client_ip.json,
-- the file the C core and Python check too. The rules are the core's.
local client_ip = require "hirate.client_ip"
local core = require "hirate.core"
local json = require "dkjson"
local support = require "helpers.support"

-- dkjson reads null as nil.
local doc = assert(json.decode(support.read(support.root .. "/tests/vectors/client_ip.json")))
assert(#doc.resolve >= 40 and #doc.bucket_keys > 0 and #doc.errors > 0)

local function options(config)
    return { trusted_proxies = config.trusted_proxies, proxy_hops = config.proxy_hops,
        forwarded_header = config.header, ipv6_subnet = config.ipv6_subnet }
end

describe("client_ip.json", function()
    for _, c in ipairs(doc.resolve) do
        it(c.rule, function()
            local compiled = client_ip.compile(options(c.config))
            local address = client_ip.resolve(compiled, c.peer, c.values)
            assert.equal(c.address, address)
            local key = client_ip.key(compiled, address)
            assert.equal(c.key, key)
            local ident = core.ident_for_ip(key)
            assert.equal(c.ident, ident)
            assert.equal(c.bucket_key, core.bucket_key(ident, c.scope, c.head))
        end)
    end
    for _, c in ipairs(doc.bucket_keys) do
        it(c.rule, function()
            assert.equal(c.bucket_key, core.bucket_key(c.ident, c.scope, c.head))
        end)
    end
    for _, c in ipairs(doc.errors) do
        it(c.error, function()
            local ok, err = pcall(client_ip.compile, options(c.config))
            assert.is_false(ok)
            assert.equal(c.error, (tostring(err):gsub("^[^\n]-:%d+: ", "")))
        end)
    end
    it("a key function's value is k:<value>, bytes as they are", function()
        assert.equal("k:\0\255", core.ident_for_key("\0\255"))
        assert.equal("ip:unknown", core.ident_for_ip(nil))
    end)
end)
