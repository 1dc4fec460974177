-- ARGV: prefix, node, ttl ms, grace ms, live id... Ends every connection the
-- store holds for node that the node no longer has (closed while Redis was
-- away); returns the reply of a transition.
local node, ttl, grace = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local live = {}
for i = 5, #ARGV do live[ARGV[i]] = true end
local out = new_out()
for _, id in ipairs(redis.call('SMEMBERS', P .. 'nc:' .. node)) do
  if not live[id] then remove(id, 2, ttl, grace, out) end
end
return reply(out)
