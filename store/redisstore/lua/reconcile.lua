-- KEYS: the shard's (prelude) and the node's connection set, nc:<node>
-- (KEYS[13]). ARGV: node, ttl ms, grace ms, since ms, live id... Ends every
-- connection the store holds for node that the node no longer has (closed
-- while Redis was away, or left by a previous process with this node id),
-- except those connected or heard from since `since`: they are newer than
-- the node's list of live ids.
-- The users of those connections are found in the set, so their keys are
-- found too (found_user in the prelude: the shard's hash tag, its slot).
local node, ttl, grace, since = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local NC = KEYS[13]
local live = {}
for i = 5, #ARGV do live[ARGV[i]] = true end
local out = new_out()
local function nc_of(n)
  if n == node then return NC end
  return found_nc(n)
end
local ended = new_batch()
for _, id in ipairs(redis.call('SMEMBERS', NC)) do
  if not live[id] and num(redis.call('ZSCORE', DL, id)) - ttl < since then
    local uk = detach(id, 2, ttl, found_user, nc_of)
    if uk then batch_add(ended, uk) end
  end
end
settle_all(ended, grace, out)
return reply(out)
