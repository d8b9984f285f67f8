-- Limit strings (docs/semantics.md, "Limit strings"): every case of the shared
-- tests/vectors/limit_strings.json through hirate.parse_limits, which hands
-- the text to the core's parser. A valid text gives exactly the vector's
-- limits, window in seconds (the vector's window_s); an invalid one gives
-- nil, the vector's exact message, "EOPTION", as any runtime error of the
-- module does. A text that is not a string raises, as any bad argument does.
local json = require "dkjson"
local hirate = require "hirate"
local support = require "helpers.support"

local raises, pack = support.raises, support.pack
local int_subtype = math.type ~= nil   -- 5.3 and later

local doc = assert(json.decode(support.read(support.root .. "/tests/vectors/limit_strings.json")))
assert(#doc.valid > 0 and #doc.invalid > 0)

-- The limits the Lua API must give for a vector's limits.
local function wanted(limits)
    local out = {}
    for i, l in ipairs(limits) do
        out[i] = { capacity = l.capacity, rate = l.rate, count = l.count, window = l.window_s }
    end
    return out
end

describe("hirate.parse_limits", function()
    it("is the core's, in plain Lua and in OpenResty alike", function()
        assert.equal(require("hirate.core").parse_limits, hirate.parse_limits)
    end)

    for _, c in ipairs(doc.valid) do
        it(("reads %q"):format(c.text), function()
            local got = pack(hirate.parse_limits(c.text))
            assert.equal(1, got.n)
            local limits = got[1]
            assert.same(wanted(c.limits), limits)
            for i, l in ipairs(limits) do
                -- The rate is the vector's double to the last bit, and count / window.
                assert.equal(c.limits[i].rate, l.rate)
                assert.equal(l.count / l.window, l.rate)
                if int_subtype then
                    assert.same({ "integer", "integer", "integer", "float" },
                        { math.type(l.capacity), math.type(l.count), math.type(l.window),
                            math.type(l.rate) })
                end
            end
        end)
    end

    for _, c in ipairs(doc.invalid) do
        it(("refuses %q: %s"):format(c.text, c.error), function()
            assert.same({ n = 3, nil, c.error, "EOPTION" }, pack(hirate.parse_limits(c.text)))
        end)
    end

    -- { what, argument, message }
    local bad = {
        { "no argument", nil, "text must be a string, got no value" },
        { "a number", 10, "text must be a string, got number" },
        { "a table", { "10/s" }, "text must be a string, got table" },
        { "a boolean", true, "text must be a string, got boolean" },
        { "a text with a NUL byte", "10/s\0garbage", "text contains a NUL byte" },
    }
    for _, c in ipairs(bad) do
        it("raises for " .. c[1], function()
            raises("bad argument #1 to 'parse_limits' (" .. c[3] .. ")", function()
                if c[2] == nil then
                    local _ = hirate.parse_limits()
                else
                    local _ = hirate.parse_limits(c[2])
                end
            end)
        end)
    end

    it("gives limits that make a limiter", function()
        local l = assert(hirate.parse_limits("100/minute burst 20"))[1]
        local lim = hirate.new { capacity = l.capacity, rate = l.rate }
        assert.equal(19, lim:allow("k").remaining)
        assert.equal(20, lim:allow("k").limit)
        lim:close()
    end)
end)
