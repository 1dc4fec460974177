-- KEYS: the shard's (prelude) and the user's (KEYS[12] to KEYS[15]).
-- ARGV: id, user, active (1/0), ttl ms.
local id, user, active, ttl = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local uk = given_user(user)
local owner = redis.call('HGET', C, id)
if not owner then return redis.error_reply('UNKNOWN connection') end
-- The keys declared are the user's the node holds the connection for.
if owner ~= user then
  return redis.error_reply('MISMATCH connection held by another user than the one given')
end
local e = redis.call('HGET', uk.uc, id)
local d, n = parse(e)
redis.call('HSET', uk.uc, id, d .. '\n' .. n .. '\n' .. active)
redis.call('ZADD', DL, NOW_MS + ttl, id)
local out = new_out()
publish_if_changed(uk, out)
return reply(out)
