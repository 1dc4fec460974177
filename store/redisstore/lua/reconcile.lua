-- ARGV: prefix, node, ttl ms, grace ms, since ms, live id... Ends every
-- connection the store holds for node that the node no longer has (closed
-- while Redis was away, or left by a previous process with this node id),
-- except those connected or heard from since `since`: they are newer than
-- the node's list of live ids.
local node, ttl, grace, since = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local live = {}
for i = 6, #ARGV do live[ARGV[i]] = true end
local out = new_out()
for _, id in ipairs(redis.call('SMEMBERS', P .. 'nc:' .. node)) do
  if not live[id] and num(redis.call('ZSCORE', DL, id)) - ttl < since then
    remove(id, 2, ttl, grace, out)
  end
end
return reply(out)
