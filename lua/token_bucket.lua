-- hirate token bucket. One call decides one (key, cost) atomically, in every
-- band of the key's limit ("10 per second and 1000 per day"): the cost is
-- spent in all of them or in none.
--
-- KEYS[1]  the bucket
-- ARGV     capacity and rate of each band, in order (n >= 1 bands), then:
--          capacity: whole tokens, 1 .. 2^53-1
--          rate: tokens per second, > 0 (in the fewest digits that read back exactly)
-- then     cost: whole tokens, 0 .. 2^53-1
--          "1" spends the cost when it passes, "0" only looks (peek),
--          "2" gives the cost back (a refund): each band gets it, capped
--          at its capacity, and the reply is the bucket after (allowed)
--          optional, test vectors only: the time in microseconds
--
-- Returns {allowed, remaining, retry_after_us, reset_after_us, tokens, ts, now_us, key,
--          then remaining, retry_after_us, reset_after_us, tokens, ts of bands 2 .. n}:
-- allowed 1/0 for the whole; for each band, remaining whole tokens after the
-- decision, retry_after_us (0 when the band holds the cost, -1 when the cost
-- is above its capacity: never), reset_after_us, and tokens and ts, its stored
-- state after the decision (tokens as a string: an integer reply would
-- truncate it), from which a client can tell exactly what any later call
-- would see; now_us the time of the decision; key KEYS[1] echoed so the
-- client can prove the reply answers its own call. One band's reply is the
-- first eight.
--
-- State: one string "tokens ts tokens ts ..." (a band each, in order)
-- written by one SET ... PX, the only write, so an OOM refusal leaves
-- nothing half done and no key ever lacks a TTL. A missing key, or a band
-- the string lacks, is a full bucket, which is why the TTL is the longest
-- time a band takes to refill; stored bands beyond n are dropped at the
-- next write. The arithmetic is core/src/bucket.c's, operation for
-- operation.

if redis.replicate_commands then redis.replicate_commands() end

local EXACT = 9007199254740991

local key = KEYS[1]
local nargs = #ARGV
local n = math.floor((nargs - 2) / 2)
local cost = tonumber(ARGV[2 * n + 1])
local mode = ARGV[2 * n + 2]
local spend, refund = mode == "1", mode == "2"

if n < 1 then
  return redis.error_reply("ERR hirate: the call needs a capacity and a rate, a cost and a spend flag")
end
-- Every band's figures in one flat table, six a band (fewer tables: a
-- script's every table costs the server an allocation and its collection):
-- capacity, rate, then tokens, ts, level and retry below.
local b = {}
for i = 1, n do
  local capacity, rate = tonumber(ARGV[2 * i - 1]), tonumber(ARGV[2 * i])
  if not (capacity and capacity >= 1 and capacity <= EXACT and capacity % 1 == 0) then
    return redis.error_reply("ERR hirate: capacity must be a whole number from 1 to 2^53-1")
  end
  if not (rate and rate > 0 and rate < math.huge and capacity * 1000000 / rate <= EXACT) then
    return redis.error_reply("ERR hirate: rate must be positive and refill the bucket in under 2^53 us")
  end
  b[6 * i - 5], b[6 * i - 4] = capacity, rate
end
if not (cost and cost >= 0 and cost <= EXACT and cost % 1 == 0) then
  return redis.error_reply("ERR hirate: cost must be a whole number from 0 to 2^53-1")
end

local now
if nargs % 2 == 1 then
  now = tonumber(ARGV[nargs])
  if not (now and now >= 0 and now <= EXACT and now % 1 == 0) then
    return redis.error_reply("ERR hirate: time must be whole microseconds from 0 to 2^53-1")
  end
else
  local t = redis.call("TIME")
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- What a call at now + r would compute from the stored state (s, t0), before
-- min(capacity, .). A clock that went back refills nothing.
local function level_at(s, t0, r, rate)
  local elapsed = (now - t0) + r
  if elapsed < 0 then elapsed = 0 end
  return s + elapsed * rate / 1000000
end

-- Microseconds until the stored state (s, t0) holds target tokens: the least
-- r with level_at(s, t0, r) >= target, in the very arithmetic a later call
-- uses, so that a caller who waits r is not refused by a rounding.
local function until_level(s, t0, target, rate)
  local level = level_at(s, t0, 0, rate)
  if level >= target then return 0 end
  local r = math.ceil((target - level) * 1000000 / rate)
  if t0 > now then r = r + (t0 - now) end
  -- The estimate is within a few units; the loops are bounded all the same,
  -- since a script that spins blocks the whole server.
  for _ = 1, 64 do
    if level_at(s, t0, r, rate) >= target then break end
    r = r + 1
  end
  for _ = 1, 64 do
    if r <= 1 or level_at(s, t0, r - 1, rate) < target then break end
    r = r - 1
  end
  return r
end

-- The stored state, a band each; a missing key or band is a full bucket at
-- now. Each band looks first; the cost is spent only when every band holds it.
local state = redis.call("GET", key)
local pos, allowed, refunded = 1, 1, false
for i = 1, n do
  local o = 6 * i - 6
  local capacity, rate = b[o + 1], b[o + 2]
  local tokens, ts = capacity, now
  if state and pos <= #state then
    local a, c
    a, c, pos = string.match(state, "^(%S+) (%d+)()", pos)
    tokens, ts = tonumber(a), tonumber(c)
    if not (tokens and ts) or (pos <= #state and string.byte(state, pos) ~= 32) then
      return redis.error_reply("ERR hirate: bucket state is corrupt")
    end
    pos = pos + 1
  end
  local level = math.min(capacity, level_at(tokens, ts, 0, rate))
  local retry = 0
  if refund then
    -- A band already full reads the same whether stored or not: it stays.
    if cost > 0 and level < capacity then
      tokens = math.min(capacity, level + cost)
      if now > ts then ts = now end
      level = tokens
      refunded = true
    end
  elseif cost > capacity then
    retry, allowed = -1, 0
  elseif level < cost then
    retry, allowed = until_level(tokens, ts, cost, rate), 0
  end
  b[o + 3], b[o + 4], b[o + 5], b[o + 6] = tokens, ts, level, retry
end

local spent = allowed == 1 and spend and cost > 0
local write = spent or refunded
local reply = {allowed, 0, 0, 0, 0, 0, now, key}
local stored, ttl_ms = nil, 0
for i = 1, n do
  local o = 6 * i - 6
  local capacity, rate, tokens, ts, level = b[o + 1], b[o + 2], b[o + 3], b[o + 4], b[o + 5]
  if spent then
    tokens = level - cost
    if now > ts then ts = now end
    level = tokens
  end
  local reset = until_level(tokens, ts, capacity, rate)
  local t = string.format("%.17g", tokens)
  local at = i == 1 and 2 or 5 * i - 1
  reply[at], reply[at + 1], reply[at + 2], reply[at + 3], reply[at + 4] =
    math.floor(level), b[o + 6], reset, t, ts
  if write then
    local band = t .. " " .. string.format("%d", ts)
    stored = stored and stored .. " " .. band or band
    local ms = math.ceil(reset / 1000)
    if ms > ttl_ms then ttl_ms = ms end
  end
end

if write then
  -- An injected clock runs apart from the real one, which the TTL counts
  -- in: keep such keys for a minute more so a test cannot see them expire.
  if nargs % 2 == 1 then ttl_ms = ttl_ms + 60000 end
  if ttl_ms > 0 then
    redis.call("SET", key, stored, "PX", ttl_ms)
  else
    redis.call("DEL", key)   -- a refund filled every band: a missing key is full
  end
end

return reply
