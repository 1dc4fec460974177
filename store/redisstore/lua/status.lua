-- ARGV: prefix, id, active (1/0), ttl ms.
local id, active, ttl = ARGV[2], ARGV[3], tonumber(ARGV[4])
local user = redis.call('HGET', P .. 'c', id)
if not user then return redis.error_reply('UNKNOWN connection') end
local e = redis.call('HGET', P .. 'uc:' .. user, id)
local d, n = parse(e)
redis.call('HSET', P .. 'uc:' .. user, id, d .. '\n' .. n .. '\n' .. active)
redis.call('ZADD', DL, NOW_MS + ttl, id)
local out = new_out()
publish_if_changed(user, out)
return reply(out)
