-- wrk script of the OpenResty contenders (bench/peers/nginx/peer_nginx.py):
-- each request asks for PATH?k=user:NNNNNN, the key drawn uniformly from
-- KEYS keys (KEYS = 1: one hot key), seeded per thread; responses are
-- counted by status; at the end one line of JSON (requests, seconds,
-- statuses, latency percentiles in microseconds, socket errors).
--
--   wrk -t1 -cC -dDs -s wrk_keys.lua http://127.0.0.1:PORT/hirate -- KEYS SEED
local threads = {}

function setup(thread)
    thread:set("id", #threads + 1)
    threads[#threads + 1] = thread
end

function init(args)
    nkeys = tonumber(args[1]) or 1
    math.randomseed((tonumber(args[2]) or 1) * 1000 + id)
    base = wrk.path .. "?k=user:"
    statuses = {}
end

function request()
    local k = nkeys == 1 and 0 or math.random(0, nkeys - 1)
    return wrk.format(nil, base .. string.format("%06d", k))
end

function response(status)
    statuses[status] = (statuses[status] or 0) + 1
end

function done(summary, latency)
    local total = {}
    for _, t in ipairs(threads) do
        for status, n in pairs(t:get("statuses")) do
            total[status] = (total[status] or 0) + n
        end
    end
    local parts = {}
    for status, n in pairs(total) do
        parts[#parts + 1] = string.format('"%d": %d', status, n)
    end
    local e = summary.errors
    io.write(string.format('PEER-NGINX {"requests": %d, "seconds": %.6f, "statuses": {%s}, '
        .. '"p50_us": %d, "p99_us": %d, "socket_errors": %d}\n',
        summary.requests, summary.duration / 1e6, table.concat(parts, ", "),
        latency:percentile(50), latency:percentile(99),
        e.connect + e.read + e.write + e.timeout))
end
