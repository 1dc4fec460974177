-- KEYS: the shard's (prelude). ARGV: forget-after ms, batch limit.
-- Forgets the users offline for forget-after, by the shard's offline set
-- (OFF: user → when their offline was published, ms, Redis's clock;
-- publish_if_changed writes it and a comeback leaves it): their state (u:),
-- its copy (sv:) and entries left in uc: by connections that no longer
-- exist. Team membership (ut:) is kept. Those users are found in the set,
-- so their keys cannot be named in KEYS in advance: found_user builds them
-- with the shard's hash tag, hence its slot. Returns how many were forgotten.
local after, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
local n = 0
for _, user in ipairs(redis.call('ZRANGEBYSCORE', OFF, '-inf', NOW_MS - after, 'LIMIT', 0, limit)) do
  redis.call('ZREM', OFF, user)
  local uk = found_user(user)
  local h = redis.call('HMGET', uk.u, 's', 'grace')
  -- Only a user still offline, out of grace, with no connection: any other
  -- came back, and goes into the set again when next offline.
  if num(h[1]) == 0 and not h[2] then
    local live = false
    for _, id in ipairs(redis.call('HKEYS', uk.uc)) do
      if redis.call('HGET', C, id) == user then live = true else redis.call('HDEL', uk.uc, id) end
    end
    if not live and redis.call('DEL', uk.u, uk.sv) > 0 then n = n + 1 end
  end
end
return n
