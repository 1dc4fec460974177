-- KEYS: the live-node set of channel counts (gd:{px}:nodes). ARGV: node,
-- ttl ms. Marks the node live until now + ttl, by this master's clock, the
-- one px_live.lua reads. Reply: the expiry, which the node stamps on its
-- counts (px_drop.lua).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local exp = now + tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], exp, ARGV[1])
return exp
