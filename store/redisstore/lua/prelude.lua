-- Shared by every script: prepended by the Go side (Redis has no require),
-- after the two lines that set WH_ON and WH_MAX (scripts.go: webhooks on,
-- and the bound of each shard's webhook stream).
-- KEYS start with the shard's keys, always in this order (shardKeys in
-- scripts.go); a script about one user takes that user's keys after them
-- (KEYS[13] to KEYS[16], see given_user), and some a node's connection set
-- after those. Every key a script touches shares the shard's hash tag, hence
-- one cluster slot.
local DL, C, NODES, GRACE, PRESENT = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local LS, HO, FL, OFF, EM, WH = KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11]
-- ST: the shard's status expiries, user -> expires_at ms (set_status).
local ST = KEYS[12]
local t = redis.call('TIME')
local NOW_US = tonumber(t[1]) * 1000000 + tonumber(t[2])
local NOW_MS = math.floor(NOW_US / 1000)

local function num(s) return tonumber(s or '0') or 0 end
local function fmt(n) return string.format('%.0f', n) end

-- A user's keys, as a script passes them to derive, publish_if_changed and
-- remove: state (u:), connections (uc:), the state's copy (sv:), teams (ut:).
-- given_user names those the caller declared, at KEYS[13] to KEYS[16].
local function given_user(user)
  return {user = user, u = KEYS[13], uc = KEYS[14], sv = KEYS[15], ut = KEYS[16]}
end

-- The one exception to declared keys: sweep, reconcile and forget find
-- users (and sweep dead nodes) while they run, in the shard's sets, so the
-- keys of those cannot be named before the call. They are built here and
-- nowhere else, from the prefix of the shard's own declared KEYS[1], so they
-- carry its hash tag and stay in the slot the call was routed to.
local SHARD = string.sub(DL, 1, -3) -- 'gd:{gdN}:' from 'gd:{gdN}:dl'
local function found_user(user)
  return {user = user, u = SHARD .. 'u:' .. user, uc = SHARD .. 'uc:' .. user,
    sv = SHARD .. 'sv:' .. user, ut = SHARD .. 'ut:' .. user}
end
local function found_nc(node)
  if node == '' then return nil end
  return SHARD .. 'nc:' .. node
end

-- A user's connections: uc:<user> maps connection id to
-- "device\nnode\nactive\nseq". seq counts the node's status writes for the
-- connection: a re-assertion carries the one its active flag is from, so one
-- that lost a race with a newer status write does not undo it. (Entries
-- without seq, written before it existed, read as seq 0.)
local function parse(e)
  local d, n, a, q = string.match(e, '^(.-)\n(.-)\n(%d)\n?(%d*)$')
  return d, n, a, tonumber(q) or 0
end
local function entry(device, node, active, seq)
  return device .. '\n' .. node .. '\n' .. active .. '\n' .. seq
end

-- Rule 4: online if any device is active, away if all idle, offline if none.
-- uk: the user's keys (given_user or found_user).
local function derive(uk)
  local vals = redis.call('HVALS', uk.uc)
  if #vals == 0 then return 0 end
  for _, e in ipairs(vals) do
    local _, _, a = parse(e)
    if a == '1' then return 1 end
  end
  return 2
end

-- A new version of the user: the largest of the last one plus one, Redis's
-- clock in microseconds and the shard's resync floor plus one (floor.lua),
-- so versions keep increasing even after Redis loses its data, and exceed
-- any floor a resync sent.
local function next_version(u)
  local v = fmt(math.max(num(redis.call('HGET', u, 'v')) + 1, NOW_US, num(redis.call('GET', FL)) + 1))
  redis.call('HSET', u, 'v', v)
  return v
end

-- What viewers see of a user (presence.Look in Go): the shown state w (0
-- offline, 1 online, 2 away, 3 dnd), text, emoji, expiry ms and, for
-- offline, the last seen they were told, as one string in u's field lk.
-- The user's own fields: s the real state (the devices', grace applied),
-- m the mode (0 auto, 1 dnd, 2 invisible), tx, em, ex the status, ss since
-- when w holds, sl the last seen told with an offline, a and as the actual
-- state (s with dnd applied) and since when.
local function look_str(w, tx, em, ex, sl)
  return w .. '\n' .. tx .. '\n' .. em .. '\n' .. fmt(ex) .. '\n' .. fmt(sl)
end

-- show publishes what viewers see of the user if it differs from what they
-- were told (presence's showLocked); v: a version the caller took already,
-- or nil.
local function show(uk, out, v)
  local user, u = uk.user, uk.u
  local h = redis.call('HMGET', u, 's', 'm', 'tx', 'em', 'ex', 'lk', 'ss', 'sl', 'a', 'seen')
  local real, mode = num(h[1]), num(h[2])
  local tx, em, ex = h[3] or '', h[4] or '', num(h[5])
  local actual = real
  if real ~= 0 and mode == 1 then actual = 3 end
  if h[9] == false or num(h[9]) ~= actual then redis.call('HSET', u, 'a', actual, 'as', NOW_MS) end
  local w, ltx, lem, lex = actual, tx, em, 0
  if mode == 2 then
    w, ltx, lem = 0, '', ''
  elseif tx ~= '' or em ~= '' or w == 3 then
    lex = ex
  end
  -- Users written before the look existed were shown their state alone.
  local old = h[6]
  if not old then
    local ls = 0
    if real == 0 then ls = num(h[10]) end
    old = look_str(real, '', '', 0, ls)
  end
  local since, sl = num(h[7]), num(h[8])
  local oldw = tonumber(string.match(old, '^(%d+)'))
  if w ~= oldw then
    since = NOW_MS
    if w == 0 then
      -- Hidden by invisibility: last seen now. Really offline: the last
      -- sign of life.
      sl = num(h[10])
      if real ~= 0 then sl = NOW_MS end
    end
  end
  local lsl = 0
  if w == 0 then lsl = sl end
  local lk = look_str(w, ltx, lem, lex, lsl)
  if lk == old then return end
  if not v then v = next_version(u) end
  redis.call('HSET', u, 'lk', lk, 'ss', fmt(since), 'sl', fmt(sl))
  -- A copy of what viewers see as a plain string, so that a snapshot reads
  -- a shard's users with one MGET instead of an HMGET per user. Not a field
  -- of one shard-wide hash: below 512 entries Redis keeps a hash as a
  -- listpack, whose every lookup scans it (9 us for three users of 500).
  -- "w:v:since:expires:lastseen\ntext\nemoji"; text and emoji hold no line
  -- breaks (the server refuses control characters).
  redis.call('SET', uk.sv, w .. ':' .. v .. ':' .. fmt(since) .. ':' .. fmt(lex) .. ':' .. fmt(lsl) .. '\n' .. ltx .. '\n' .. lem)
  local teams = redis.call('SMEMBERS', uk.ut)
  table.insert(out.changes, {user, w, v, NOW_MS, teams, ltx, lem, fmt(lex), fmt(since), fmt(lsl), oldw})
  if WH_ON then
    -- The webhook event, in the same script as the change: emitted exactly
    -- once, or not at all if the change is not. A full stream loses its
    -- oldest entries, and the new one says how many (dr) for the metric.
    local dropped = 0
    if redis.call('XLEN', WH) >= WH_MAX then
      dropped = redis.call('XTRIM', WH, 'MAXLEN', WH_MAX - 1)
    end
    local seen = ''
    if w == 0 and lsl > 0 then seen = fmt(lsl) end
    redis.call('XADD', WH, '*', 'u', user, 's', w, 'p', oldw, 'v', v, 'at', NOW_MS,
      'seen', seen, 't', table.concat(teams, '\n'), 'tx', ltx, 'em', lem, 'dr', dropped)
  end
end

-- Publishes what viewers see if the derived state changes it. During grace
-- the real state stands.
local function publish_if_changed(uk, out)
  local user, u = uk.user, uk.u
  if redis.call('HEXISTS', u, 'grace') == 1 then return end
  local s = derive(uk)
  local cur = num(redis.call('HGET', u, 's'))
  -- The devices' state is unchanged, and so is the look: the mode and the
  -- status change only through set_status, which shows them itself. A
  -- second device, a reconnect in grace or a flip beside an active device
  -- costs no more than this.
  if s == cur then return end
  do
    if redis.call('HEXISTS', u, 'lk') == 0 then
      -- Written before the look existed (or new): viewers were shown cur.
      local ls = 0
      if cur == 0 then ls = num(redis.call('HGET', u, 'seen')) end
      redis.call('HSET', u, 'lk', look_str(cur, '', '', 0, ls))
    end
    -- The shard's count of users not offline, for greendot_users_online.
    if cur == 0 then redis.call('INCR', PRESENT) elseif s == 0 then redis.call('DECR', PRESENT) end
    redis.call('HSET', u, 's', s)
    -- The shard's offline set, by when each user went offline: forget.lua
    -- forgets those offline for forget-after. A comeback leaves it.
    if s == 0 then redis.call('ZADD', OFF, NOW_MS, user) elseif cur == 0 then redis.call('ZREM', OFF, user) end
  end
  show(uk, out, nil)
end

-- Replaces the user's status whole (presence's setStatusLocked): an equal
-- one changes nothing; any other takes a new version, reported for the
-- user's own connections, and shows what viewers see at that version. The
-- shard's status expiries (ST) hold one entry per user with an expiry.
local function set_status(uk, mode, tx, em, ex, out)
  local u = uk.u
  local h = redis.call('HMGET', u, 'm', 'tx', 'em', 'ex')
  if num(h[1]) == mode and (h[2] or '') == tx and (h[3] or '') == em and num(h[4]) == ex then return end
  redis.call('HSET', u, 'm', mode, 'tx', tx, 'em', em, 'ex', fmt(ex))
  if ex > 0 then redis.call('ZADD', ST, ex, uk.user) else redis.call('ZREM', ST, uk.user) end
  local v = next_version(u)
  table.insert(out.statuses, {uk.user, mode, tx, em, fmt(ex), v})
  show(uk, out, v)
end

-- Ends a connection without deciding what its user's state becomes (see
-- settle); returns the user's keys, or nil when the connection is unknown.
-- cause: 0 closed (the close is the last sign of life), 1 expired, 2 lost
-- with its node (the last recorded sign of life counts). keys_of(user)
-- names the keys of the connection's user and nc_of(node) the set of the
-- node holding it (nil: none): given keys for a script that declared them
-- and checked they are the connection's, found ones for a script that
-- discovered the connection. heard, when given: the connection's last sign
-- of life (ms, Redis's clock) as its node knew it, which its last
-- heartbeat batch may not have carried yet.
local function detach(id, cause, ttl, keys_of, nc_of, heard)
  local user = redis.call('HGET', C, id)
  if not user then return nil end
  local uk = keys_of(user)
  local e = redis.call('HGET', uk.uc, id)
  local node = ''
  if e then
    local _, n = parse(e)
    node = n or ''
  end
  local seen = num(redis.call('ZSCORE', DL, id)) - ttl
  if cause == 0 then seen = NOW_MS elseif heard then seen = heard end
  redis.call('HDEL', C, id)
  redis.call('HDEL', uk.uc, id)
  redis.call('ZREM', DL, id)
  local nc = nc_of(node)
  if nc then redis.call('SREM', nc, id) end
  local u = uk.u
  if seen > num(redis.call('HGET', u, 'seen')) then
    redis.call('HSET', u, 'seen', fmt(seen))
  end
  return uk
end

-- Decides the state of a user whose connections were detached: the grace
-- if none is left, else what the rest derive. Several connections ended by
-- one event (a node lost, deadlines found late together) are all detached
-- first and their users settled once (see settle_all), so that no state in
-- between (away, when the active device went first) is published.
local function settle(uk, grace, out)
  if redis.call('HLEN', uk.uc) == 0 then
    if redis.call('HEXISTS', uk.u, 'grace') == 1 then return end
    local g = NOW_MS + grace
    redis.call('HSET', uk.u, 'grace', fmt(g))
    redis.call('ZADD', GRACE, g, uk.user)
    out.gs = out.gs + 1
  else
    publish_if_changed(uk, out)
  end
end

-- Ends a connection and settles its user.
local function remove(id, cause, ttl, grace, out, keys_of, nc_of)
  local uk = detach(id, cause, ttl, keys_of, nc_of)
  if not uk then return false end
  settle(uk, grace, out)
  return true
end

-- A set of users to settle once each, in the order first seen.
local function new_batch() return {list = {}, seen = {}} end
local function batch_add(b, uk)
  if not b.seen[uk.user] then
    b.seen[uk.user] = true
    table.insert(b.list, uk)
  end
end
local function settle_all(b, grace, out)
  for _, uk in ipairs(b.list) do settle(uk, grace, out) end
end

local function new_out() return {gc = 0, gs = 0, expired = {}, lags = {}, glags = {}, changes = {}, statuses = {}, sx = 0} end

-- Reply: {grace cancelled, grace started, {expired ids}, {lags ms},
-- {statuses expired, status...}, {grace lags ms}, change...} where a grace
-- lag is how late past its grace end an offline was decided, a status is {user, mode,
-- text, emoji, expires ms, version} and a change {user, shown state,
-- version, at ms, {teams}, text, emoji, expires ms, since ms, last seen ms,
-- previous shown state}.
local function reply(out)
  local st = {out.sx}
  for _, s in ipairs(out.statuses) do table.insert(st, s) end
  local r = {out.gc, out.gs, out.expired, out.lags, st, out.glags}
  for _, c in ipairs(out.changes) do table.insert(r, c) end
  return r
end
