-- ARGV: prefix, node, leaving (1/0). A node's liveness, kept in every shard
-- so each shard's sweep can judge it within its own slot. A leaving node is
-- marked as long dead, so sweepers release whatever it still holds at once
-- (and drop it once it holds nothing). Returns 1 when this node was missing
-- from the shard: Redis lost its data, or the node was taken for dead and
-- released; either way the node must re-assert its connections.
local nodes = P .. 'nodes'
local missing = 0
if not redis.call('ZSCORE', nodes, ARGV[2]) then missing = 1 end
local score = NOW_MS
if ARGV[3] == '1' then score = 0 end
redis.call('ZADD', nodes, score, ARGV[2])
return missing
