-- KEYS: the shard's (prelude) and the user's (KEYS[13] to KEYS[16]).
-- ARGV: id, user, active (1/0), ttl ms, seq (the node's count of status
-- writes for the connection, this one included).
local id, user, active, ttl, seq = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local uk = given_user(user)
local owner = redis.call('HGET', C, id)
if not owner then return redis.error_reply('UNKNOWN connection') end
-- The keys declared are the user's the node holds the connection for.
if owner ~= user then
  return redis.error_reply('MISMATCH connection held by another user than the one given')
end
local e = redis.call('HGET', uk.uc, id)
local d, n, _, held = parse(e)
-- A write that arrives after a newer one (two calls in flight on two
-- connections to Redis) changes nothing.
if seq >= held then redis.call('HSET', uk.uc, id, entry(d, n, active, seq)) end
redis.call('ZADD', DL, NOW_MS + ttl, id)
local out = new_out()
publish_if_changed(uk, out)
return reply(out)
