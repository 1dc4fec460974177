-- KEYS: the shard's (prelude), the user's (KEYS[13] to KEYS[16]) and the
-- node's connection set, nc:<node> (KEYS[17]). ARGV: id, cause (0 closed,
-- 1 expired, 2 lost), ttl ms, grace ms, user, node, known (1/0: the node held
-- the connection, not merely tried to connect it), grace ms for a user Redis
-- lost (at least the hold-off), ms since the node last heard from the
-- connection (-1: not known; the last heartbeat batch counts).
local id, cause, user, node = ARGV[1], tonumber(ARGV[2]), ARGV[5], ARGV[6]
local uk, NC = given_user(user), KEYS[17]
-- The keys declared are those of the connection's user and node: a record
-- naming others is refused before anything changes.
local owner = redis.call('HGET', C, id)
if owner and owner ~= user then
  return redis.error_reply('MISMATCH connection held by another user than the one given')
end
if owner then
  local e = redis.call('HGET', uk.uc, id)
  local _, n = parse(e or '')
  if e and n ~= node then
    return redis.error_reply('MISMATCH connection held by another node than the one given')
  end
end
local out = new_out()
if cause == 1 then
  -- Expired by its node: report it, with how late past its deadline.
  local dl = redis.call('ZSCORE', DL, id)
  if dl then
    table.insert(out.expired, id)
    table.insert(out.lags, math.max(0, NOW_MS - tonumber(dl)))
  end
end
local ttl, grace = tonumber(ARGV[3]), tonumber(ARGV[4])
local given = function() return uk end
local nc = function() return NC end
local heard
if tonumber(ARGV[9]) >= 0 then heard = NOW_MS - tonumber(ARGV[9]) end
if detach(id, cause, ttl, given, nc, heard) then
  if cause == 1 then
    -- The user's other connections on this node whose deadline has passed
    -- too are expiring at the same moment (the node reaps them in the same
    -- tick): ended with this one and the user settled once, so no state in
    -- between is published (away, when the active device went first).
    local entries = redis.call('HGETALL', uk.uc)
    for i = 1, #entries, 2 do
      local cid = entries[i]
      local _, n = parse(entries[i + 1])
      local dl = redis.call('ZSCORE', DL, cid)
      if n == node and dl and tonumber(dl) <= NOW_MS then
        detach(cid, 1, ttl, given, nc)
        table.insert(out.expired, cid)
        table.insert(out.lags, NOW_MS - tonumber(dl))
      end
    end
  end
  settle(uk, grace, out)
  return reply(out)
end
-- Redis does not know the connection. If it lost the user altogether (a
-- flush, a failover to an empty replica) while the node still held the
-- connection, viewers still see the user online: take the user through
-- the grace to a published offline, with versions above any held. That
-- grace lasts at least the hold-off: another node may still hold a live
-- connection of the user that it has not written back yet.
local u = uk.u
if ARGV[7] == '1' and redis.call('EXISTS', u) == 0 and redis.call('HLEN', uk.uc) == 0 then
  local v = fmt(math.max(NOW_US, num(redis.call('GET', FL)) + 1))
  redis.call('HSET', u, 's', 1, 'v', v, 'seen', fmt(NOW_MS))
  redis.call('SET', uk.sv, '1:' .. v)
  local g = NOW_MS + tonumber(ARGV[8])
  redis.call('HSET', u, 'grace', fmt(g))
  redis.call('ZADD', GRACE, g, user)
  out.gs = 1
  return reply(out)
end
return redis.error_reply('UNKNOWN connection')
