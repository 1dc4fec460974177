-- ARGV: prefix, ttl ms, user. Reply: {state, version, last seen ms, grace, conn entries...}
local user, ttl = ARGV[3], tonumber(ARGV[2])
local u = P .. 'u:' .. user
local h = redis.call('HMGET', u, 's', 'v', 'seen')
local seen = num(h[3])
local conns = redis.call('HGETALL', P .. 'uc:' .. user)
local r = {num(h[1]), h[2] or '0', 0}
for i = 1, #conns, 2 do
  local dl = num(redis.call('ZSCORE', DL, conns[i]))
  if dl - ttl > seen then seen = dl - ttl end
  table.insert(r, conns[i + 1])
end
r[3] = fmt(seen)
return r
