-- hirate token bucket. One call decides one (key, cost) atomically, in every
-- band of the key's limit ("10 per second and 1000 per day"): the cost is
-- spent in all of them or in none.
--
-- KEYS[1]  the bucket
-- ARGV     capacity and rate of each band, in order (n >= 1 bands), then:
--          capacity: whole tokens, 1 .. 2^53-1
--          rate: tokens per second, > 0 (in the fewest digits that read back exactly)
-- then     cost: whole tokens, 0 .. 2^53-1
--          "1" spends the cost when it passes, "0" only looks (peek)
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
local spend = ARGV[2 * n + 2] == "1"
local caps, rates = {}, {}

if n < 1 then
  return redis.error_reply("ERR hirate: the call needs a capacity and a rate, a cost and a spend flag")
end
for i = 1, n do
  local capacity, rate = tonumber(ARGV[2 * i - 1]), tonumber(ARGV[2 * i])
  if not (capacity and capacity >= 1 and capacity <= EXACT and capacity % 1 == 0) then
    return redis.error_reply("ERR hirate: capacity must be a whole number from 1 to 2^53-1")
  end
  if not (rate and rate > 0 and rate < math.huge and capacity * 1000000 / rate <= EXACT) then
    return redis.error_reply("ERR hirate: rate must be positive and refill the bucket in under 2^53 us")
  end
  caps[i], rates[i] = capacity, rate
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

-- The stored state, a band each; a missing key or band is a full bucket at now.
local tokens, ts = {}, {}
local state = redis.call("GET", key)
local pos = 1
for i = 1, n do
  local a, b
  if state and pos <= #state then
    a, b, pos = string.match(state, "^(%S+) (%d+)()", pos)
    a, b = tonumber(a), tonumber(b)
    if not (a and b) or (pos <= #state and string.byte(state, pos) ~= 32) then
      return redis.error_reply("ERR hirate: bucket state is corrupt")
    end
    pos = pos + 1
  end
  tokens[i], ts[i] = a or caps[i], b or now
end

-- Each band looks first; the cost is spent only when every band holds it.
local level, retry = {}, {}
local allowed = 1
for i = 1, n do
  level[i] = math.min(caps[i], level_at(tokens[i], ts[i], 0, rates[i]))
  if cost > caps[i] then
    retry[i] = -1
    allowed = 0
  elseif level[i] >= cost then
    retry[i] = 0
  else
    retry[i] = until_level(tokens[i], ts[i], cost, rates[i])
    allowed = 0
  end
end

local reply = {allowed}
local parts, ttl_ms = {}, 0
for i = 1, n do
  if allowed == 1 and spend and cost > 0 then
    tokens[i] = level[i] - cost
    if now > ts[i] then ts[i] = now end
    level[i] = tokens[i]
  end
  local reset = until_level(tokens[i], ts[i], caps[i], rates[i])
  local t = string.format("%.17g", tokens[i])
  parts[i] = t .. " " .. string.format("%d", ts[i])
  local ms = math.ceil(reset / 1000)
  if ms > ttl_ms then ttl_ms = ms end
  local at = i == 1 and 2 or 5 * i - 1
  reply[at], reply[at + 1], reply[at + 2], reply[at + 3], reply[at + 4] =
    math.floor(level[i]), retry[i], reset, t, ts[i]
end
reply[7], reply[8] = now, key

if allowed == 1 and spend and cost > 0 then
  -- An injected clock runs apart from the real one, which the TTL counts
  -- in: keep such keys for a minute more so a test cannot see them expire.
  if nargs % 2 == 1 then ttl_ms = ttl_ms + 60000 end
  redis.call("SET", key, table.concat(parts, " "), "PX", ttl_ms)
end

return reply
