-- hirate token bucket. One call decides one (key, cost) atomically.
--
-- KEYS[1]  the bucket
-- ARGV[1]  capacity: whole tokens, 1 .. 2^53-1
-- ARGV[2]  rate: tokens per second, > 0 (in the fewest digits that read back exactly)
-- ARGV[3]  cost: whole tokens, 0 .. 2^53-1
-- ARGV[4]  "1" spends the cost when it passes, "0" only looks (peek)
-- ARGV[5]  optional, test vectors only: the time in microseconds
--
-- Returns {allowed, remaining, retry_after_us, reset_after_us, tokens, ts, now_us, key}:
-- allowed 1/0; remaining whole tokens after the decision; retry_after_us -1
-- when cost > capacity (never); tokens and ts the stored state after the
-- decision (tokens as a string: an integer reply would truncate it), from
-- which a client can tell exactly what any later call would see; now_us the
-- time of the decision; key KEYS[1] echoed so the client can prove the reply
-- answers its own call.
--
-- State: one string "tokens ts" written by one SET ... PX, the only write, so
-- an OOM refusal leaves nothing half done and no key ever lacks a TTL. A
-- missing key is a full bucket, which is why the TTL is the time to refill.
-- The arithmetic is core/src/bucket.c's, operation for operation.

if redis.replicate_commands then redis.replicate_commands() end

local EXACT = 9007199254740991

local key = KEYS[1]
local capacity = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local spend = ARGV[4] == "1"

if not (capacity and capacity >= 1 and capacity <= EXACT and capacity % 1 == 0) then
  return redis.error_reply("ERR hirate: capacity must be a whole number from 1 to 2^53-1")
end
if not (rate and rate > 0 and rate < math.huge and capacity * 1000000 / rate <= EXACT) then
  return redis.error_reply("ERR hirate: rate must be positive and refill the bucket in under 2^53 us")
end
if not (cost and cost >= 0 and cost <= EXACT and cost % 1 == 0) then
  return redis.error_reply("ERR hirate: cost must be a whole number from 0 to 2^53-1")
end

local now
if ARGV[5] then
  now = tonumber(ARGV[5])
  if not (now and now >= 0 and now <= EXACT and now % 1 == 0) then
    return redis.error_reply("ERR hirate: time must be whole microseconds from 0 to 2^53-1")
  end
else
  local t = redis.call("TIME")
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- What a call at now + r would compute from the stored state (s, t0), before
-- min(capacity, .). A clock that went back refills nothing.
local function level_at(s, t0, r)
  local elapsed = (now - t0) + r
  if elapsed < 0 then elapsed = 0 end
  return s + elapsed * rate / 1000000
end

-- Microseconds until the stored state (s, t0) holds target tokens: the least
-- r with level_at(s, t0, r) >= target, in the very arithmetic a later call
-- uses, so that a caller who waits r is not refused by a rounding.
local function until_level(s, t0, target)
  local level = level_at(s, t0, 0)
  if level >= target then return 0 end
  local r = math.ceil((target - level) * 1000000 / rate)
  if t0 > now then r = r + (t0 - now) end
  -- The estimate is within a few units; the loops are bounded all the same,
  -- since a script that spins blocks the whole server.
  for _ = 1, 64 do
    if level_at(s, t0, r) >= target then break end
    r = r + 1
  end
  for _ = 1, 64 do
    if r <= 1 or level_at(s, t0, r - 1) < target then break end
    r = r - 1
  end
  return r
end

-- The stored state; a missing key is a full bucket at now.
local tokens, ts = capacity, now
local state = redis.call("GET", key)
if state then
  local a, b = string.match(state, "^(%S+) (%d+)$")
  tokens, ts = tonumber(a), tonumber(b)
  if not (tokens and ts) then
    return redis.error_reply("ERR hirate: bucket state is corrupt")
  end
end

local level = math.min(capacity, level_at(tokens, ts, 0))
local allowed, retry = 0, 0
if cost > capacity then
  retry = -1
elseif level >= cost then
  allowed = 1
  if spend and cost > 0 then
    tokens = level - cost
    if now > ts then ts = now end
    level = tokens
    local ttl_ms = math.ceil(until_level(tokens, ts, capacity) / 1000)
    -- An injected clock runs apart from the real one, which the TTL counts
    -- in: keep such keys for a minute more so a test cannot see them expire.
    if ARGV[5] then ttl_ms = ttl_ms + 60000 end
    redis.call("SET", key, string.format("%.17g %d", tokens, ts), "PX", ttl_ms)
  end
else
  retry = until_level(tokens, ts, cost)
end

return {allowed, math.floor(level), retry, until_level(tokens, ts, capacity),
        string.format("%.17g", tokens), ts, now, key}
