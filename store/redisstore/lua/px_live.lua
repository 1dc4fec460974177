-- KEYS: the live-node set of channel counts (gd:{px}:nodes), node -> expiry
-- ms by this master's clock. Reply: {live nodes, {dead node, its expiry,
-- ...}}; the dead are removed here, their counts by the caller (px_drop.lua).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local dead = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES')
if #dead > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  for i = 2, #dead, 2 do dead[i] = string.format('%.0f', tonumber(dead[i])) end
end
return {redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf'), dead}
