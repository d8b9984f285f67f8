-- The calls tests/lua/alloc_fail.c runs again and again, each time with Lua's
-- allocator failing from one allocation further on. Every function of
-- hirate.core that allocates Lua memory, on every path; nothing here needs a
-- running Redis (port 1 refuses at once).
local core = require "hirate.core"

local mem = core.new { capacity = 5, rate = 1, prefix = "af:" }
local d = assert(mem:allow("alice", 2))
assert(d.remaining == 3)
assert(mem:peek("alice").remaining == 3)
local ds = assert(mem:allow_many { { "a", 1 }, { "b" }, { "c", 6 } })
assert(#ds == 3 and ds[3].retry_after == math.huge)
assert(mem:reset("alice"))
assert(mem:_decide_at("bob", 1, true, 1000).remaining == 4)
assert(mem:_stats().memory_keys >= 1)
local st = assert(mem:stats())
assert(st.decisions["local"] >= 1 and #st.latency.bounds == 13 and st.errors.EKEY == 0)
assert(tostring(mem):find("memory", 1, true))
assert(not pcall(mem.allow, mem, ""))            -- an argument error, raised
assert(not pcall(core.new, { capacity = 0, rate = 1 }))
mem:close()
assert(mem:allow("alice") == nil)               -- nil, "limiter is closed", "ECLOSED"

local red = core.new { url = "redis://:pw@127.0.0.1:1/2", capacity = 5, rate = 1,
    connect_timeout = 0.05, on_error = "open" }
assert(tostring(red):find("***", 1, true))
assert(red:_endpoint().port == 1)
assert(red:_endpoint().where == "127.0.0.1:1")
assert(red:allow("k").source == "fail_open")    -- connect refused: the policy
assert(red:stats().errors.ECONNECT == 1 and red:stats().breaker_opens == 1)

-- The breaker is open now: an op decided at once, without I/O.
local op = red:_op_start({ { "k", 1 } }, true)
assert(op:request() == nil and op:results()[1].source == "fail_open")

-- The op hooks on a fresh limiter of the EVALSHA path, with a log function:
-- a request, NOSCRIPT twice, the EVAL to send, then a failure the policy
-- answers.
local fresh = core.new { url = "redis://127.0.0.1:1", capacity = 5, rate = 1, on_error = "closed",
    functions = false, log = function() end }
op = fresh:_op_start({ { "k", 1 }, { "j", 2 } }, true)
assert(#op:request() > 0)
local noscript = "-NOSCRIPT No matching script.\r\n"
assert(op:feed(noscript) == "more")
assert(op:feed(noscript) == "send")
assert(op:request():find("EVAL", 1, true))
op:fail("ETIMEDOUT", "receive: timeout")
assert(op:results()[2].error == "ETIMEDOUT")
assert(op:drop())
op:free()
-- A misconfiguration fails each item with its error, message and all (on a
-- limiter of its own: fresh's breaker is open now).
local misconfigured = core.new { url = "redis://127.0.0.1:1", capacity = 5, rate = 1 }
op = misconfigured:_op_start({ { "k", 1 }, { "j", 2 } }, true)
op:fail("ETLS", "TLS handshake: certificate verify failed")
assert(op:results()[2].error == "ETLS" and op:results()[1].message)
op:free()
-- The handshake op: its bytes, a failure, its result; then the backoff
-- refuses the next one (nil, message, code).
local other = core.new { url = "redis://:pw@127.0.0.1:1/2", capacity = 5, rate = 1 }
local hs = assert(other:_handshake_start())
assert(#hs:request() > 0 and tostring(hs))
hs:fail("ECONNECT", "connect: connection refused")
assert(select(3, hs:result()) == "ECONNECT")
hs:free()
assert(select(3, other:_handshake_start()) == "ECONNECT")
-- A reset op, and a handshake left running for lua_close.
local reset = assert(other:_op_start_reset("k"))
assert(tostring(reset))
local running = core.new { url = "redis://127.0.0.1:1", capacity = 5, rate = 1 }
assert(running:_handshake_start())
-- One op left waiting, and its limiter closed under it: lua_close frees both.
local waiting = core.new { url = "redis://127.0.0.1:1", capacity = 5, rate = 1 }
local pending = waiting:_op_start({ { "w", 1 } }, false, 5)
assert(pending:request())
waiting:close()
assert(tostring(pending))
-- Limit strings: the limits' tables, and an error's nil, message, code.
local limits = assert(core.parse_limits("10/second; 1000/day burst 5"))
assert(#limits == 2 and limits[2].capacity == 5 and limits[1].window == 1)
assert(select(3, core.parse_limits("100/fortnight")) == "EOPTION")
assert(not pcall(core.parse_limits, 10))          -- an argument error, raised
-- Several limits: a table of bands and limit strings, each decision with
-- each band's figures, the bands, a band's error; on Redis, an op's band
-- figures (decided by the policy, the breaker being open).
local banded = core.new { limits = { { capacity = 3, rate = 1, name = "burst" }, "10/minute" } }
local bd = assert(banded:allow("k", 2))
assert(bd.band == 1 and #bd.bands == 2 and bd.bands[2].name == "10-per-60s")
assert(banded:peek("k").bands[1].remaining == 1)
assert(banded:_decide_at("j", 1, true, 1000).bands[2].remaining == 9)
assert(banded:allow_many({ { "k", 1 } })[1].band == 1)
assert(#banded:bands() == 2 and tostring(banded):find("burst", 1, true))
assert(not pcall(core.new, { limits = { "1/s", { capacity = 0, rate = 1 } } }))
assert(not pcall(core.new, { limits = { { capacity = 1, rate = 1, name = "a" },
    { capacity = 2, rate = 1, name = "a" } } }))
banded:close()
local rbanded = core.new { url = "redis://127.0.0.1:1", limits = "2/s; 5/minute",
    on_error = "open", connect_timeout = 0.05 }
assert(rbanded:allow("k").source == "fail_open")
op = rbanded:_op_start({ { "k", 1 } }, true, nil, true)
assert(op:request() == nil and #op:results()[1].bands == 2)
op:free()
rbanded:close()
assert(core.refill_seconds(10, 2) == 5)
-- Garbage whose finalizers run deeper than any call before (collectgarbage
-- at the bottom of a recursion), so that each __gc call needs new memory:
-- where it is refused, Lua skips that __gc for good, and the core's objects
-- must still be freed by lua_close.
local function collect_deep(depth)
    if depth == 0 then
        core.new { capacity = 1, rate = 1 }:allow("g")
        local gone = core.new { url = "redis://127.0.0.1:1", capacity = 1, rate = 1 }
        gone:_handshake_start()
        gone:_op_start({ { "g", 1 } }, true)
        gone = nil
        collectgarbage()
        return true
    end
    local done = collect_deep(depth - 1)   -- not a tail call: each level a frame
    return done
end
assert(collect_deep(30))
-- And one open limiter for lua_close to collect.
core.new { capacity = 1, rate = 1 }:allow("x")
return "done"
