-- KEYS: the shard's deadlines only (KEYS[1] of the prelude's layout): the
-- one key it touches. It runs without the prelude, whose ~280 lines (closures
-- built on every call) it does not need. ARGV: ttl ms, id... Moves each known connection's
-- deadline; returns the ids the store does not know, for their node to
-- re-assert.
--
-- One variadic ZADD per 1,000 ids, not one per id: each call from Lua cost
-- Redis ~2.3 µs, most of a heartbeat's price. unpack is bounded by Lua's C
-- stack (8,000 values), hence the chunks.
local DL = KEYS[1]
local t = redis.call('TIME')
local at = string.format('%.0f', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[1]))
local CHUNK = 1000
local changed = 0
for first = 2, #ARGV, CHUNK do
  local args = {}
  for i = first, math.min(first + CHUNK - 1, #ARGV) do
    args[#args + 1] = at
    args[#args + 1] = ARGV[i]
  end
  changed = changed + redis.call('ZADD', DL, 'XX', 'CH', unpack(args))
end
if changed == #ARGV - 1 then return {} end
-- Fewer changed than asked: unknown ids, or (rarely) a deadline that already
-- was this one. ZMSCORE tells them apart.
local missing = {}
for first = 2, #ARGV, CHUNK do
  local ids = {}
  for i = first, math.min(first + CHUNK - 1, #ARGV) do ids[#ids + 1] = ARGV[i] end
  for j, score in ipairs(redis.call('ZMSCORE', DL, unpack(ids))) do
    if not score then missing[#missing + 1] = ids[j] end
  end
end
return missing
