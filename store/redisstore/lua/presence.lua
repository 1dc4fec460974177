-- KEYS: the shard's (prelude) and the user's (KEYS[13] to KEYS[16]).
-- ARGV: ttl ms. Reply: {shown state, version, last seen ms, {status and
-- look fields}, conn entries...}; see show in the prelude for the fields.
local uk, ttl = given_user(), tonumber(ARGV[1])
local h = redis.call('HMGET', uk.u, 's', 'v', 'seen', 'lk', 'm', 'tx', 'em', 'ex', 'ss', 'sl', 'a', 'as')
local seen = num(h[3])
local conns = redis.call('HGETALL', uk.uc)
-- Users written before the look existed: their state is the shown one.
local w = num(h[1])
if h[4] then w = tonumber(string.match(h[4], '^(%d+)')) end
local actual = h[11] or tostring(num(h[1]))
local sl = h[10] or '0'
if not h[4] and num(h[1]) == 0 then sl = h[3] or '0' end -- offline before the look existed
local r = {w, h[2] or '0', 0, {num(h[5]), h[6] or '', h[7] or '', h[8] or '0', h[9] or '0', sl, actual, h[12] or '0'}}
for i = 1, #conns, 2 do
  local dl = num(redis.call('ZSCORE', DL, conns[i]))
  if dl - ttl > seen then seen = dl - ttl end
  table.insert(r, conns[i + 1])
end
r[3] = fmt(seen)
return r
