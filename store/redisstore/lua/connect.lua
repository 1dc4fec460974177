-- ARGV: prefix, id, user, device, node, ttl ms, active (1/0), assert (1/0).
-- With assert set, a connection the store already knows is refreshed
-- instead of refused: that is how a node re-asserts its live connections.
local id, user, device, node = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local ttl, active, assert = tonumber(ARGV[6]), ARGV[7], ARGV[8] == '1'
local out = new_out()
local owner = redis.call('HGET', P .. 'c', id)
if owner and not assert then return redis.error_reply('DUPLICATE connection id in use') end
redis.call('HSET', P .. 'c', id, user)
redis.call('HSET', P .. 'uc:' .. user, id, device .. '\n' .. node .. '\n' .. active)
redis.call('ZADD', DL, NOW_MS + ttl, id)
redis.call('SADD', P .. 'nc:' .. node, id)
local u = P .. 'u:' .. user
if redis.call('HEXISTS', u, 'grace') == 1 then
  redis.call('HDEL', u, 'grace')
  redis.call('ZREM', P .. 'grace', user)
  out.gc = 1
end
-- A user Redis lost is published again (online, with a new version):
-- viewers who hold that state already see no change.
publish_if_changed(user, out)
return reply(out)
