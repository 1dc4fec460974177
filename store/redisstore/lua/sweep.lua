-- KEYS: the shard's (prelude). ARGV: ttl ms, grace ms, node ttl ms,
-- hold-off ms, batch limit, gap ms (a pause in sweeping longer than this
-- starts a hold-off), the sweeping node, recovering (1/0: it is writing its
-- connections back after an outage or a loss, or wrote them back after a
-- loss less than a hold-off ago).
-- One shard's sweep, atomic: whatever it claims, no other node can. What it
-- claims is found while it runs (dead nodes in NODES, their connections in
-- their nc: sets, late deadlines in DL, ended graces in GRACE, expired
-- statuses in ST), and so are
-- the keys of those users and nodes: found_user and found_nc (prelude) build
-- them with the shard's hash tag, hence its slot.
local ttl, grace, nodettl = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local holdoff, limit, gap = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local out = new_out()
-- found: the dead nodes this sweep found; live, rank: set when it found any
-- (below); crashed: those of them that stopped beating rather than left,
-- each as "node beat": they may have died between a script and its
-- publish (sweep.go, tellNodeDead).
local found, live, rank, crashed = 0, 0, -1, {}
-- The reply: whether the shard is in a data loss's hold-off (EM: nodes
-- refuse snapshots meanwhile), the outcome, then found, live and rank, in
-- how many ms the shard's next claim falls due (its owner sweeps it then
-- rather than every tick; -1: nothing is waiting; 0: sweep again at once,
-- as in a hold-off), crashed, and the sweep record it wrote (LS: nodes
-- judge others' shards stale by it, sweep.go).
local record = fmt(NOW_MS)
local function swept(due) return {redis.call('EXISTS', EM), reply(out), found, live, rank, due, crashed, record} end
-- next_due: the earliest of a grace end, a status expiry, a deadline a ttl
-- late (the safety net below) and a node's beat a node ttl old, in ms from
-- now; -1 when the shard holds none of them.
local function next_due()
  local due
  local function at(key, late)
    local r = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
    if #r == 2 then
      local t = tonumber(r[2]) + late
      if not due or t < due then due = t end
    end
  end
  at(GRACE, 0)
  at(ST, 0)
  at(DL, ttl)
  at(NODES, nodettl)
  if not due then return -1 end
  return math.max(0, due - NOW_MS)
end
-- Nobody swept for a while: Redis was away or restarted with old data, or
-- every node was paused. Hold off, so live nodes beat and re-assert before
-- anything of theirs may be taken for dead.
-- A shard never swept (no record) is new (a fresh Redis, a first deploy):
-- nothing in it is stale, so nothing holds off. Unless it was emptied under
-- live nodes (FLUSHALL, a failover to an empty replica): then the sweeper,
-- which beat into every shard before it swept, is missing from it, or its
-- beat found it missing and it is re-asserting. That holds off too: until
-- every live node has written its connections back, a grace that ends may
-- be that of a user with a connection Redis does not know yet.
local last = redis.call('GET', LS)
redis.call('SET', LS, record)
-- (Or a node's beat found it missing and said so in EM: beat.lua.)
local emptied = not last and (ARGV[8] == '1' or not redis.call('ZSCORE', NODES, ARGV[7])
  or redis.call('EXISTS', EM) == 1)
if emptied or (last and NOW_MS - tonumber(last) > gap) then
  redis.call('SET', HO, NOW_MS + holdoff)
  -- Reads of an emptied shard miss the users of nodes not written back yet:
  -- EM tells them so (States refuses) until the hold-off is over.
  if emptied then redis.call('SET', EM, '1', 'PX', holdoff) end
  return swept(0)
end
if NOW_MS < num(redis.call('GET', HO)) then return swept(0) end
-- Nothing due: next_due reads the first entry of each set the claims below
-- read up to now, so when it is in the future (or there is none) each of
-- them would find nothing. Most sweeps end here (BenchmarkSweepNothingDue).
local due = next_due()
if due ~= 0 then return swept(due) end

-- Connections of dead nodes: released well before their own ttl.
local dead = redis.call('ZRANGEBYSCORE', NODES, '-inf', NOW_MS - nodettl, 'WITHSCORES', 'LIMIT', 0, 10)
for i = 1, #dead, 2 do
  local node, beat = dead[i], tonumber(dead[i + 1])
  local nc = found_nc(node)
  local ids = redis.call('SPOP', nc, limit)
  local lost = new_batch()
  for _, id in ipairs(ids) do
    local uk = detach(id, 2, ttl, found_user, found_nc)
    if uk then
      batch_add(lost, uk)
      table.insert(out.expired, id)
      -- A node that left (beat 0) is released at once: no lag to report.
      local lag = 0
      if beat > 0 then lag = NOW_MS - (beat + nodettl) end
      table.insert(out.lags, math.max(0, lag))
    end
  end
  settle_all(lost, grace, out)
  if redis.call('SCARD', nc) == 0 then
    redis.call('ZREM', NODES, node)
  end
  if beat > 0 then table.insert(crashed, node .. ' ' .. fmt(beat)) end
end
-- A node found dead is ranked out at once: the count of the nodes live here
-- and the sweeper's rank among them by name (as beat.lua counts them) let
-- the sweeper take its new share of the shards now, and sweep every shard
-- this once, rather than leave the dead node's shards unowned until its
-- next beat (sweep.go).
if #dead > 0 then
  found = #dead / 2
  local nodes = redis.call('ZRANGEBYSCORE', NODES, '(' .. fmt(NOW_MS - nodettl), '+inf')
  table.sort(nodes)
  live = #nodes
  for i, n in ipairs(nodes) do
    if n == ARGV[7] then rank = i - 1 break end
  end
end

-- A safety net: a connection silent for ttl past its deadline although its
-- node lives (the node normally expires its own silent connections).
local late = redis.call('ZRANGEBYSCORE', DL, '-inf', NOW_MS - ttl, 'WITHSCORES', 'LIMIT', 0, limit)
local overdue = new_batch()
for i = 1, #late, 2 do
  local uk = detach(late[i], 1, ttl, found_user, found_nc)
  if uk then
    batch_add(overdue, uk)
    table.insert(out.expired, late[i])
    table.insert(out.lags, NOW_MS - tonumber(late[i + 1]))
  end
end
settle_all(overdue, grace, out)

-- Graces that are over, and statuses whose expiry has come (each reset to
-- auto, once, by the one sweep that claims it here), in the order they fell
-- due, a grace end first on a tie: as the tracker takes them, so a user
-- whose grace and status both ended since the last sweep is published as
-- the clock went.
local ends = redis.call('ZRANGEBYSCORE', GRACE, '-inf', NOW_MS, 'WITHSCORES', 'LIMIT', 0, limit)
local sts = redis.call('ZRANGEBYSCORE', ST, '-inf', NOW_MS, 'WITHSCORES', 'LIMIT', 0, limit)
local gi, si = 1, 1
while gi <= #ends or si <= #sts do
  if gi <= #ends and (si > #sts or tonumber(ends[gi + 1]) <= tonumber(sts[si + 1])) then
    local user = ends[gi]
    gi = gi + 2
    redis.call('ZREM', GRACE, user)
    local uk = found_user(user)
    local g = redis.call('HGET', uk.u, 'grace')
    if g and tonumber(g) <= NOW_MS and redis.call('HLEN', uk.uc) == 0 then
      redis.call('HDEL', uk.u, 'grace')
      local n = #out.changes
      publish_if_changed(uk, out)
      if #out.changes > n then table.insert(out.glags, NOW_MS - tonumber(g)) end
    end
  else
    local user = sts[si]
    si = si + 2
    redis.call('ZREM', ST, user)
    local uk = found_user(user)
    local ex = num(redis.call('HGET', uk.u, 'ex'))
    if ex > 0 and ex <= NOW_MS then
      set_status(uk, 0, '', '', 0, out)
      out.sx = out.sx + 1
    end
  end
end
-- A claim left for the next sweep (a batch was full) is due at once.
if #dead > 0 or #late >= 2 * limit or #ends >= 2 * limit or #sts >= 2 * limit then return swept(0) end
return swept(next_due())
