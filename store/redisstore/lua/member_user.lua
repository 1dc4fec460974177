-- KEYS: the user's team set (ut:<user>) and membership version (mv:<user>),
-- both in the user's shard slot. ARGV: team, join (1/0).
-- The user's side orders the user's memberships: every call, even one that
-- changes nothing, takes a version above all earlier ones (the larger of
-- the last plus one and Redis's clock in microseconds, so it keeps growing
-- if the key is lost). The team's side applies calls in this order,
-- whatever order they reach it in (member_team.lua).
-- Reply: {1 if the team set changed else 0, version}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local v = string.format('%.0f', math.max(tonumber(redis.call('GET', KEYS[2]) or '0') + 1, now))
redis.call('SET', KEYS[2], v)
local changed
if ARGV[2] == '1' then
  changed = redis.call('SADD', KEYS[1], ARGV[1])
else
  changed = redis.call('SREM', KEYS[1], ARGV[1])
end
return {changed, v}
