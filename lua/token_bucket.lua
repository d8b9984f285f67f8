-- hirate token bucket. One call decides one (key, cost) atomically.
--
-- KEYS[1]  the bucket
-- ARGV[1]  capacity: whole tokens, 1 .. 2^53-1
-- ARGV[2]  rate: tokens per second, > 0 (in the fewest digits that read back exactly)
-- ARGV[3]  cost: whole tokens, 0 .. 2^53-1
-- ARGV[4]  "1" spends the cost when it passes, "0" only looks (peek)
-- ARGV[5]  optional, test vectors only: the time in microseconds
--
-- Returns {allowed, remaining, retry_after_us, reset_after_us, tokens, now_us, key}:
-- allowed 1/0; remaining whole tokens after the decision; retry_after_us -1
-- when cost > capacity (never); tokens the exact bucket level as a string (an
-- integer reply would truncate it); now_us the time of the decision; key
-- KEYS[1] echoed so the client can prove the reply answers its own call.
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

-- Microseconds until the level reaches target: the least r with
-- tokens + r * rate / 1e6 >= target in exactly the arithmetic used to refill.
local function until_level(tokens, target)
  if tokens >= target then return 0 end
  -- The estimate is within a few units; the loops are bounded all the same,
  -- since a script that spins blocks the whole server.
  local r = math.ceil((target - tokens) * 1000000 / rate)
  for _ = 1, 64 do
    if tokens + r * rate / 1000000 >= target then break end
    r = r + 1
  end
  for _ = 1, 64 do
    if r <= 1 or tokens + (r - 1) * rate / 1000000 < target then break end
    r = r - 1
  end
  return r
end

local tokens, ts = capacity, now
local state = redis.call("GET", key)
if state then
  local a, b = string.match(state, "^(%S+) (%d+)$")
  tokens, ts = tonumber(a), tonumber(b)
  if not (tokens and ts) then
    return redis.error_reply("ERR hirate: bucket state is corrupt")
  end
end

-- Refill. A clock that went back refills nothing and keeps the later time.
local elapsed = now - ts
if elapsed < 0 then elapsed = 0 end
tokens = math.min(capacity, tokens + elapsed * rate / 1000000)
if now > ts then ts = now end

local allowed, retry = 0, 0
if cost > capacity then
  retry = -1
elseif tokens >= cost then
  allowed = 1
  if spend and cost > 0 then
    tokens = tokens - cost
    local ttl_ms = math.ceil(until_level(tokens, capacity) / 1000)
    -- An injected clock runs apart from the real one, which the TTL counts
    -- in: keep such keys for a minute more so a test cannot see them expire.
    if ARGV[5] then ttl_ms = ttl_ms + 60000 end
    redis.call("SET", key, string.format("%.17g %d", tokens, ts), "PX", ttl_ms)
  end
else
  retry = until_level(tokens, cost)
end

return {allowed, math.floor(tokens), retry, until_level(tokens, capacity),
        string.format("%.17g", tokens), now, key}
