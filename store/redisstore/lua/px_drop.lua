-- KEYS: a dead node's channel counts (gd:{pxn:<node>}:ch) and their stamp
-- (gd:{pxn:<node>}:at), in the node's slot. ARGV: the expiry px_live.lua
-- found dead. Deleted only if still stamped with it: a node that came back
-- meanwhile has written fresh counts, stamped with a later expiry.
-- Reply: 1 if deleted.
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1], KEYS[2])
return 1
