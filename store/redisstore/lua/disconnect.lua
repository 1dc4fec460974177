-- ARGV: prefix, id, cause (0 closed, 1 expired, 2 lost), ttl ms, grace ms, user,
-- grace ms for a user Redis lost (at least the hold-off).
local id, cause, user = ARGV[2], tonumber(ARGV[3]), ARGV[6]
local out = new_out()
if cause == 1 then
  -- Expired by its node: report it, with how late past its deadline.
  local dl = redis.call('ZSCORE', DL, id)
  if dl then
    table.insert(out.expired, id)
    table.insert(out.lags, math.max(0, NOW_MS - tonumber(dl)))
  end
end
if remove(id, cause, tonumber(ARGV[4]), tonumber(ARGV[5]), out) then
  return reply(out)
end
-- Redis does not know the connection. If it lost the user altogether (a
-- flush, a failover to an empty replica) while the node still held the
-- connection, viewers still see the user online: take the user through
-- the grace to a published offline, with versions above any held. That
-- grace lasts at least the hold-off: another node may still hold a live
-- connection of the user that it has not written back yet.
local u = P .. 'u:' .. user
if user ~= '' and redis.call('EXISTS', u) == 0 and redis.call('HLEN', P .. 'uc:' .. user) == 0 then
  local v = fmt(math.max(NOW_US, num(redis.call('GET', P .. 'fl')) + 1))
  redis.call('HSET', u, 's', 1, 'v', v, 'seen', fmt(NOW_MS))
  redis.call('SET', P .. 'sv:' .. user, '1:' .. v)
  local g = NOW_MS + tonumber(ARGV[7])
  redis.call('HSET', u, 'grace', fmt(g))
  redis.call('ZADD', P .. 'grace', g, user)
  out.gs = 1
  return reply(out)
end
return redis.error_reply('UNKNOWN connection')
