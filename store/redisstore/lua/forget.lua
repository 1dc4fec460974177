-- ARGV: prefix, forget-after ms, batch limit. KEYS[1] is the shard's offline
-- set, P .. 'off' (user → when their offline was published, ms, Redis's
-- clock; publish_if_changed writes it and a comeback leaves it), so the
-- prelude's DL names it here. Forgets the users offline for forget-after:
-- their state (u:), its copy (sv:) and entries left in uc: by connections
-- that no longer exist. Team membership (ut:) is kept. Those keys are found
-- from the users due, so they cannot be named in KEYS in advance; they carry
-- the shard's hash tag, hence its slot. Returns how many were forgotten.
local OFF = KEYS[1]
local after, limit = tonumber(ARGV[2]), tonumber(ARGV[3])
local n = 0
for _, user in ipairs(redis.call('ZRANGEBYSCORE', OFF, '-inf', NOW_MS - after, 'LIMIT', 0, limit)) do
  redis.call('ZREM', OFF, user)
  local u, uc = P .. 'u:' .. user, P .. 'uc:' .. user
  local h = redis.call('HMGET', u, 's', 'grace')
  -- Only a user still offline, out of grace, with no connection: any other
  -- came back, and goes into the set again when next offline.
  if num(h[1]) == 0 and not h[2] then
    local live = false
    for _, id in ipairs(redis.call('HKEYS', uc)) do
      if redis.call('HGET', P .. 'c', id) == user then live = true else redis.call('HDEL', uc, id) end
    end
    if not live and redis.call('DEL', u, P .. 'sv:' .. user) > 0 then n = n + 1 end
  end
end
return n
