-- KEYS: the shard's deadlines only (KEYS[1] of the prelude's layout): the
-- one key it touches. ARGV: ttl ms, id... Moves each known connection's deadline; returns the ids the store
-- does not know, for their node to re-assert.
local ttl = tonumber(ARGV[1])
local missing = {}
for i = 2, #ARGV do
  local id = ARGV[i]
  if redis.call('ZADD', DL, 'XX', 'CH', NOW_MS + ttl, id) == 0 and not redis.call('ZSCORE', DL, id) then
    table.insert(missing, id)
  end
end
return missing
