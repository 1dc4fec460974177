-- KEYS: the shard's (prelude) and the user's (KEYS[12] to KEYS[15]).
-- ARGV: ttl ms. Reply: {state, version, last seen ms, grace, conn entries...}
local uk, ttl = given_user(), tonumber(ARGV[1])
local h = redis.call('HMGET', uk.u, 's', 'v', 'seen')
local seen = num(h[3])
local conns = redis.call('HGETALL', uk.uc)
local r = {num(h[1]), h[2] or '0', 0}
for i = 1, #conns, 2 do
  local dl = num(redis.call('ZSCORE', DL, conns[i]))
  if dl - ttl > seen then seen = dl - ttl end
  table.insert(r, conns[i + 1])
end
r[3] = fmt(seen)
return r
