-- KEYS: the shard's, in the prelude's order; it runs without the prelude,
-- whose functions every call would build for nothing (every node beats
-- into every shard each second). ARGV: node, leaving (1/0), beaten (1/0:
-- this process beat before), hold-off ms, node ttl ms, restoring (1/0: this
-- node found a data loss and has not written its connections back yet).
-- A node's
-- liveness, kept in every shard (NODES) so each shard's sweep can judge it
-- within its own slot. A leaving node is marked as long dead, so sweepers
-- release whatever it still holds at once (and drop it once it holds
-- nothing). Returns {missing, live, rank, beating}: missing is 1 when this node was
-- missing from the shard (Redis lost its data, or the node was taken for
-- dead and released; either way the node must re-assert its connections);
-- live counts the nodes that beat within the node ttl, and rank is this
-- node's place among them by name, from 0: the shards are shared out by it
-- for sweeping (loops.go).
local NODES, LS, HO, EM = KEYS[3], KEYS[6], KEYS[7], KEYS[10]
local t = redis.call('TIME')
local NOW_MS = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function num(s) return tonumber(s or '0') or 0 end
local missing = 0
local prev = redis.call('ZSCORE', NODES, ARGV[1])
if not prev then missing = 1 end
-- Missing, after beating before, with no sweep record: Redis lost the
-- shard's data. Say so here, in the step that writes this node back:
-- a sweep that runs before this node has handled the reply would find it
-- in NODES, as in a fresh Redis, and take the shard for whole (sweep.lua).
if missing == 1 and ARGV[3] == '1' and redis.call('EXISTS', LS) == 0 then
  local holdoff = tonumber(ARGV[4])
  redis.call('SET', HO, NOW_MS + holdoff)
  redis.call('SET', EM, '1', 'PX', holdoff)
end
-- A loss's hold-off (EM, HO) lasts while a node that found the loss has
-- not written its connections back, not only its fixed time: a second
-- outage or a cluster answering CLUSTERDOWN can keep a node from it for
-- longer, and a shard that reads whole meanwhile lists that node's users
-- offline (chaos, cluster: a master restarted empty, then killed again
-- within the hold-off and back with its data).
if ARGV[6] == '1' and redis.call('EXISTS', EM) == 1 then
  local holdoff = tonumber(ARGV[4])
  redis.call('SET', EM, '1', 'PX', holdoff)
  if num(redis.call('GET', HO)) < NOW_MS + holdoff then redis.call('SET', HO, NOW_MS + holdoff) end
end
local score = NOW_MS
if ARGV[2] == '1' then score = 0 end
redis.call('ZADD', NODES, score, ARGV[1])
local live = redis.call('ZRANGEBYSCORE', NODES, NOW_MS - tonumber(ARGV[5]), '+inf')
table.sort(live)
local rank = -1
for i, n in ipairs(live) do
  if n == ARGV[1] then rank = i - 1 break end
end
-- beating: this node's entry was there with a beat (not a leaver's 0): on
-- a process's first beat, an earlier process under its id died without
-- leaving (loops.go, beat).
local beating = 0
if prev and tonumber(prev) > 0 then beating = 1 end
return {missing, #live, rank, beating}
