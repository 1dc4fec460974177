-- KEYS: the shard's (prelude). ARGV: node, leaving (1/0), beaten (1/0:
-- this process beat before), hold-off ms. A node's
-- liveness, kept in every shard (NODES) so each shard's sweep can judge it
-- within its own slot. A leaving node is marked as long dead, so sweepers
-- release whatever it still holds at once (and drop it once it holds
-- nothing). Returns 1 when this node was missing from the shard: Redis lost
-- its data, or the node was taken for dead and released; either way the
-- node must re-assert its connections.
local missing = 0
if not redis.call('ZSCORE', NODES, ARGV[1]) then missing = 1 end
-- Missing, after beating before, with no sweep record: Redis lost the
-- shard's data. Say so here, in the step that writes this node back:
-- a sweep that runs before this node has handled the reply would find it
-- in NODES, as in a fresh Redis, and take the shard for whole (sweep.lua).
if missing == 1 and ARGV[3] == '1' and redis.call('EXISTS', LS) == 0 then
  local holdoff = tonumber(ARGV[4])
  redis.call('SET', HO, NOW_MS + holdoff)
  redis.call('SET', EM, '1', 'PX', holdoff)
end
local score = NOW_MS
if ARGV[2] == '1' then score = 0 end
redis.call('ZADD', NODES, score, ARGV[1])
return missing
