-- ARGV: prefix, node, leaving (1/0). A node's liveness, kept in every shard
-- so each shard's sweep can judge it within its own slot. A leaving node is
-- marked as long dead, so sweepers release whatever it still holds at once
-- (and drop it once it holds nothing).
local score = NOW_MS
if ARGV[3] == '1' then score = 0 end
redis.call('ZADD', P .. 'nodes', score, ARGV[2])
return NOW_MS
