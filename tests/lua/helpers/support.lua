--- What the busted specs share: where the source tree is, reading files, and
-- checking an error message exactly.
local M = {}

--- The source tree: $HIRATE_SOURCE_DIR (tests/lua/run.sh sets it), else
-- found from this file's own path.
M.root = os.getenv("HIRATE_SOURCE_DIR")
    or debug.getinfo(1, "S").source:match("^@(.*)/tests/lua/helpers/[^/]*$")
    or "."

--- The Python the specs start helpers with: the system's where there is one,
-- since a version manager's shim (pyenv) costs a third of a second a start.
M.python = "python3"
do
    local f = io.open("/usr/bin/python3")
    if f then
        f:close()
        M.python = "/usr/bin/python3"
    end
end

function M.read(path)
    local f = assert(io.open(path, "rb"))
    local s = f:read("*a")
    f:close()
    return s
end

--- Calls fn and checks that it raised exactly message: the message alone, or
-- after the "file:line: " that luaL_error puts in front of it.
function M.raises(message, fn, ...)
    local ok, err = pcall(fn, ...)
    assert(not ok, "expected an error: " .. message)
    err = tostring(err)
    local located = err:match("^[^\n]-:%d+: (.*)$")
    if err ~= message and located ~= message then
        error(("wrong error\n  expected: %s\n  got:      %s"):format(message, err), 2)
    end
end

--- Returns the message fn raised (fails when it raised none).
function M.error_of(fn, ...)
    local ok, err = pcall(fn, ...)
    assert(not ok, "expected an error")
    return tostring(err)
end

--- Seconds, from the monotonic clock where the OS has one, as a float.
function M.now()
    local f = io.open("/proc/uptime", "r")
    local s = f:read("*n")
    f:close()
    return s
end

--- Sleeps s seconds.
function M.sleep(s)
    os.execute("sleep " .. s)
end

--- Packs a call's results with their count, nils included.
function M.pack(...)
    return { n = select("#", ...), ... }
end

--- The number of live C limiters once every unreachable one has been
-- collected, so that a collection in the middle of a test cannot change the
-- count the test compares with.
function M.settled_live()
    collectgarbage()
    collectgarbage()
    return require("hirate.core")._live()
end

return M
