-- KEYS: the team's member set (m), per member the version of the last call
-- applied to it (mv), the members' Pusher user_info (ui) and the team's
-- occupancy record (oc, occupancy.lua), all in the team's slot. ARGV: user,
-- join (1/0), version from member_user.lua, occupancy (1/0: Pusher
-- webhooks are on). A call not newer than the last one applied for this
-- member is ignored: the user's side has moved past it, and the newer call
-- brings the state the user's side holds. The versions of removed members
-- are kept, so a late add cannot bring them back.
-- A removal applied drops the member's user_info with it, and takes the
-- member out of the team's occupancy count with no webhook (a membership
-- change sends none), marked at the removal's version: both versions are
-- microseconds of the user's shard's clock, so a presence event published
-- before the removal and delivered after it is older, and does not count
-- the member again (occupancy.lua).
-- Reply: 1 if the member set changed, else 0.
local last = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
if tonumber(ARGV[3]) <= last then return 0 end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
if ARGV[2] == '1' then return redis.call('SADD', KEYS[1], ARGV[1]) end
redis.call('HDEL', KEYS[3], ARGV[1])
if ARGV[4] == '1' then
  local rec = redis.call('HGET', KEYS[4], 'u:' .. ARGV[1]) or '0:0'
  local rv, rp = string.match(rec, '^(%d+):(%d)')
  if tonumber(ARGV[3]) > (tonumber(rv) or 0) then
    if rp == '1' then
      redis.call('HINCRBY', KEYS[4], 'n', -1)
      redis.call('HSET', KEYS[4], 'u:' .. ARGV[1], ARGV[3] .. ':0:1')
    else
      redis.call('HSET', KEYS[4], 'u:' .. ARGV[1], ARGV[3] .. ':0')
    end
  end
end
return redis.call('SREM', KEYS[1], ARGV[1])
