-- KEYS: the team's member set (m) and its members' Pusher user_info (ui),
-- both in the team's slot. ARGV: user, info ('' deletes it).
-- The info is kept only for a member: checked in the same step as the
-- write, so a removal (member_team.lua, which drops the info) that runs
-- between a subscription's add and its info cannot be undone by it.
-- Reply: 1 if kept, else 0.
if ARGV[2] ~= '' and redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
  return 1
end
redis.call('HDEL', KEYS[2], ARGV[1])
return 0
