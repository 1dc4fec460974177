-- Shared by every script: prepended by the Go side (Redis has no require).
-- KEYS[1] is the shard's deadline zset; ARGV[1] the shard's key prefix, so
-- every key a script touches shares one hash tag, hence one cluster slot.
local P = ARGV[1]
local DL = KEYS[1]
local t = redis.call('TIME')
local NOW_US = tonumber(t[1]) * 1000000 + tonumber(t[2])
local NOW_MS = math.floor(NOW_US / 1000)

local function num(s) return tonumber(s or '0') or 0 end
local function fmt(n) return string.format('%.0f', n) end

-- A user's connections: uc:<user> maps connection id to "device\nnode\nactive".
local function parse(e)
  return string.match(e, '^(.-)\n(.-)\n(%d)$')
end

-- Rule 4: online if any device is active, away if all idle, offline if none.
local function derive(user)
  local vals = redis.call('HVALS', P .. 'uc:' .. user)
  if #vals == 0 then return 0 end
  for _, e in ipairs(vals) do
    local _, _, a = parse(e)
    if a == '1' then return 1 end
  end
  return 2
end

-- Publishes the derived state if it differs from the published one. Versions
-- are the largest of the last one plus one, Redis's clock in microseconds
-- and the shard's resync floor plus one (floor.lua), so they keep increasing
-- even after Redis loses its data, and exceed any floor a resync sent.
local function publish_if_changed(user, out)
  local u = P .. 'u:' .. user
  if redis.call('HEXISTS', u, 'grace') == 1 then return end
  local s = derive(user)
  local cur = num(redis.call('HGET', u, 's'))
  if s == cur then return end
  -- The shard's count of users not offline, for greendot_users_online.
  if cur == 0 then redis.call('INCR', P .. 'present') elseif s == 0 then redis.call('DECR', P .. 'present') end
  local v = math.max(num(redis.call('HGET', u, 'v')) + 1, NOW_US, num(redis.call('GET', P .. 'fl')) + 1)
  redis.call('HSET', u, 's', s, 'v', fmt(v))
  -- A copy of the state and version as a plain string, so that a snapshot
  -- reads a shard's users with one MGET instead of an HMGET per user. Not a
  -- field of one shard-wide hash: below 512 entries Redis keeps a hash as a
  -- listpack, whose every lookup scans it (9 us for three users of 500).
  redis.call('SET', P .. 'sv:' .. user, s .. ':' .. fmt(v))
  -- The shard's offline set, by when each user went offline: forget.lua
  -- forgets those offline for forget-after. A comeback leaves it.
  if s == 0 then redis.call('ZADD', P .. 'off', NOW_MS, user) elseif cur == 0 then redis.call('ZREM', P .. 'off', user) end
  local teams = redis.call('SMEMBERS', P .. 'ut:' .. user)
  table.insert(out.changes, {user, s, fmt(v), NOW_MS, teams})
end

-- Ends a connection. cause: 0 closed (the close is the last sign of life),
-- 1 expired, 2 lost with its node (the last recorded sign of life counts).
local function remove(id, cause, ttl, grace, out)
  local user = redis.call('HGET', P .. 'c', id)
  if not user then return false end
  local e = redis.call('HGET', P .. 'uc:' .. user, id)
  local node = ''
  if e then
    local _, n = parse(e)
    node = n or ''
  end
  local seen = num(redis.call('ZSCORE', DL, id)) - ttl
  if cause == 0 then seen = NOW_MS end
  redis.call('HDEL', P .. 'c', id)
  redis.call('HDEL', P .. 'uc:' .. user, id)
  redis.call('ZREM', DL, id)
  redis.call('SREM', P .. 'nc:' .. node, id)
  local u = P .. 'u:' .. user
  if seen > num(redis.call('HGET', u, 'seen')) then
    redis.call('HSET', u, 'seen', fmt(seen))
  end
  if redis.call('HLEN', P .. 'uc:' .. user) == 0 then
    local g = NOW_MS + grace
    redis.call('HSET', u, 'grace', fmt(g))
    redis.call('ZADD', P .. 'grace', g, user)
    out.gs = out.gs + 1
  else
    publish_if_changed(user, out)
  end
  return true
end

local function new_out() return {gc = 0, gs = 0, expired = {}, lags = {}, changes = {}} end

-- Reply: {grace cancelled, grace started, {expired ids}, {lags ms}, change...}
-- where a change is {user, state, version, at ms, {teams}}.
local function reply(out)
  local r = {out.gc, out.gs, out.expired, out.lags}
  for _, c in ipairs(out.changes) do table.insert(r, c) end
  return r
end
