-- KEYS: the user's team set (ut:<user>), membership version (mv:<user>),
-- state (u:<user>) and state copy (sv:<user>), all in the user's shard slot.
-- ARGV: team, join (1/0).
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
  -- A user never seen gets the copy of the state they show, offline at
  -- version 0: a snapshot then finds every team-mate in its MGET, where a
  -- missing copy costs it a second round trip to read the user's state
  -- (States). A user with a state of their own (u:) keeps what it says.
  if redis.call('EXISTS', KEYS[3], KEYS[4]) == 0 then
    redis.call('SET', KEYS[4], '0:0:0:0:0\n\n')
  end
else
  changed = redis.call('SREM', KEYS[1], ARGV[1])
  -- That copy lives as long as the user's memberships, no longer: a user
  -- with no state of their own has no other copy.
  if redis.call('EXISTS', KEYS[1], KEYS[3]) == 0 then
    redis.call('DEL', KEYS[4])
  end
end
return {changed, v}
