-- The plain-Lua examples of docs/lua.md (Quick start, Limit strings, Several
-- limits) run as
-- written, each as a program of its own under the interpreter running the
-- specs, and print what the page says they print.
local support = require "helpers.support"
local redis_server = require "helpers.redis_server"

local doc = support.read(support.root .. "/docs/lua.md")
local section = assert(doc:match("\n## Quick start %(plain Lua%)\n(.-)\n## "),
    "docs/lua.md has no Quick start (plain Lua) section")

local limits_section = assert(doc:match("\n### Limit strings\n(.-)\n##"),
    "docs/lua.md has no Limit strings section")

-- The fenced blocks of a section, in order: { lang = "lua" or "", text = ... }.
local function blocks_of(text)
    local found = {}
    for lang, block in text:gmatch("```(%w*)\n(.-)```") do
        found[#found + 1] = { lang = lang, text = block }
    end
    return found
end
local bands_section = assert(doc:match("\n### Several limits\n(.-)\n##"),
    "docs/lua.md has no Several limits section")
local metrics_section = assert(doc:match("\n## Metrics and logs\n(.-)\n##"),
    "docs/lua.md has no Metrics and logs section")

local blocks = blocks_of(section)
local limits_blocks = blocks_of(limits_section)
local bands_blocks = blocks_of(bands_section)
local metrics_blocks = blocks_of(metrics_section)

local function quote(s)
    return "'" .. s:gsub("'", "'\\''") .. "'"
end

-- Runs a Lua program with the specs' own package paths; returns its output
-- and whether it succeeded.
local function run(program, env)
    local path = os.tmpname()
    local f = assert(io.open(path, "w"))
    f:write(program)
    f:close()
    local lua = arg and arg[-1] or "lua"
    local cmd = ("LUA_PATH=%s LUA_CPATH=%s %s %s %s 2>&1"):format(quote(package.path),
        quote(package.cpath), env or "", lua, quote(path))
    local p = assert(io.popen(cmd, "r"))
    local out = p:read("*a")
    local ok = p:close()
    os.remove(path)
    return out, ok
end

describe("docs/lua.md", function()
    it("has the examples this spec runs", function()
        assert.same({ "lua", "", "lua" }, { blocks[1].lang, blocks[2].lang, blocks[3].lang })
    end)

    it("runs the in-memory example, which prints what the page shows", function()
        local out, ok = run(blocks[1].text)
        assert.truthy(ok, out)
        assert.equal(blocks[2].text, out)
    end)

    it("runs the Redis example", function()
        local srv = redis_server.start()
        local out, ok = run(blocks[3].text, "REDIS_URL=" .. srv.url)
        local keys = srv:cli("KEYS", "api:*")
        srv:close()
        assert.truthy(ok, out)
        assert.equal("served, 99 left (decided by redis)\n1\ttrue\t98\n2\ttrue\t95\n", out)
        assert.equal("api:org:7", keys)   -- user:42 was reset
    end)

    it("runs the limit strings example, which prints what the page shows", function()
        assert.same({ "lua", "" }, { limits_blocks[1].lang, limits_blocks[2].lang })
        local out, ok = run(limits_blocks[1].text)
        assert.truthy(ok, out)
        assert.equal(limits_blocks[2].text, out)
    end)

    it("runs the several limits example, which prints what the page shows", function()
        assert.same({ "lua", "" }, { bands_blocks[1].lang, bands_blocks[2].lang })
        local out, ok = run(bands_blocks[1].text)
        assert.truthy(ok, out)
        assert.equal(bands_blocks[2].text, out)
    end)

    it("runs the stats example, which prints what the page shows", function()
        assert.same({ "lua", "" }, { metrics_blocks[1].lang, metrics_blocks[2].lang })
        local out, ok = run(metrics_blocks[1].text)
        assert.truthy(ok, out)
        assert.equal(metrics_blocks[2].text, out)
    end)
end)
