-- wrk script: counts responses by status in every thread, and prints one
-- line of JSON at the end (requests, seconds, statuses, latency percentiles
-- in microseconds, socket errors) for bench/nginx/bench.py to read.
local threads = {}

function setup(thread)
    threads[#threads + 1] = thread
end

function init()
    statuses = {}
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
    io.write(string.format('HIRATE-BENCH {"requests": %d, "seconds": %.6f, "statuses": {%s}, '
        .. '"p50_us": %d, "p99_us": %d, "socket_errors": %d}\n',
        summary.requests, summary.duration / 1e6, table.concat(parts, ", "),
        latency:percentile(50), latency:percentile(99),
        e.connect + e.read + e.write + e.timeout))
end
