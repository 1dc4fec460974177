-- KEYS: the shard's (prelude), the user's (KEYS[13] to KEYS[16]) and the
-- node's connection set, nc:<node> (KEYS[17]). ARGV: id, user, device, node,
-- ttl ms, active (1/0), assert (1/0), seq (of the status write active is
-- from; status.lua).
-- With assert set, a connection the store already knows is refreshed
-- instead of refused: that is how a node re-asserts its live connections.
local id, user, device, node = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local ttl, active, assert, seq = tonumber(ARGV[5]), ARGV[6], ARGV[7] == '1', tonumber(ARGV[8]) or 0
local uk, NC = given_user(user), KEYS[17]
local out = new_out()
local owner = redis.call('HGET', C, id)
if owner and not assert then return redis.error_reply('DUPLICATE connection id in use') end
redis.call('HSET', C, id, user)
-- A re-assertion whose active flag a newer status write already replaced
-- keeps the newer one.
local held = redis.call('HGET', uk.uc, id)
if held then
  local _, _, a, q = parse(held)
  if q > seq then active, seq = a, q end
end
redis.call('HSET', uk.uc, id, entry(device, node, active, seq))
redis.call('ZADD', DL, NOW_MS + ttl, id)
redis.call('SADD', NC, id)
local u = uk.u
if redis.call('HEXISTS', u, 'grace') == 1 then
  redis.call('HDEL', u, 'grace')
  redis.call('ZREM', GRACE, user)
  out.gc = 1
end
-- A user Redis lost is published again (online, with a new version):
-- viewers who hold that state already see no change.
publish_if_changed(uk, out)
return reply(out)
