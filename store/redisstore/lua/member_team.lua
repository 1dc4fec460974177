-- KEYS: the team's member set (m), per member the version of the last call
-- applied to it (mv), the members' Pusher user_info (ui) and the team's
-- occupancy record (oc, occupancy.lua), all in the team's slot. ARGV: user,
-- join (1/0), version from member_user.lua. A call not newer than the last
-- one applied for this member is ignored: the user's side has moved past
-- it, and the newer call brings the state the user's side holds. The
-- versions of removed members are kept, so a late add cannot bring them
-- back.
-- A removal applied drops the member's user_info with it, and takes the
-- member out of the team's occupancy count with no webhook (a membership
-- change sends none), at the removal's version: both are microseconds of
-- the user's shard's clock, so a presence event published before the
-- removal, delivered after it, is older and does not count them again.
-- Reply: 1 if the member set changed, else 0.
local last = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
if tonumber(ARGV[3]) <= last then return 0 end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
if ARGV[2] == '1' then return redis.call('SADD', KEYS[1], ARGV[1]) end
redis.call('HDEL', KEYS[3], ARGV[1])
local rec = redis.call('HGET', KEYS[4], 'u:' .. ARGV[1])
if rec and string.sub(rec, -2) == ':1' then
  local n = tonumber(redis.call('HGET', KEYS[4], 'n') or '0') or 0
  redis.call('HSET', KEYS[4], 'n', math.max(n - 1, 0))
end
redis.call('HSET', KEYS[4], 'u:' .. ARGV[1], ARGV[3] .. ':0')
return redis.call('SREM', KEYS[1], ARGV[1])
