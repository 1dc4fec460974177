-- ARGV: prefix, node, leaving (1/0). A node's liveness, kept in every shard
-- so each shard's sweep can judge it within its own slot.
if ARGV[3] == '1' then
  redis.call('ZREM', P .. 'nodes', ARGV[2])
else
  redis.call('ZADD', P .. 'nodes', NOW_MS, ARGV[2])
end
return NOW_MS
