-- KEYS: the user's team set (ut:<user>) and membership version (mv:<user>),
-- both in the user's shard slot. ARGV: team, the most teams listed.
-- Read-only, O(1) for a user in more teams than listed: SCARD is O(1), and
-- SMEMBERS runs only for a set that small.
-- Reply: {1 if the user is in team else 0, version or nil, the user's teams
-- when at most ARGV[2] of them, else nil}.
local teams = false
if redis.call('SCARD', KEYS[1]) <= tonumber(ARGV[2]) then
  teams = redis.call('SMEMBERS', KEYS[1])
end
return {redis.call('SISMEMBER', KEYS[1], ARGV[1]), redis.call('GET', KEYS[2]), teams}
