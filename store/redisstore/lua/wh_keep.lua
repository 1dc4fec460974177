-- KEYS: one shard's webhook stream (wh). ARGV: group, consumer, entry id...
-- Renews the consumer's hold on the entries it still retries (their idle
-- time starts again, so no other node claims them), but only those it still
-- holds: an entry another node claimed (this one was taken for dead) or that
-- a full stream trimmed is not taken back. Returns the ids renewed.
local kept = {}
for i = 3, #ARGV do
  local id = ARGV[i]
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], id, id, 1, ARGV[2])
  if #p > 0 then
    local c = redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, id, 'JUSTID')
    if #c > 0 then table.insert(kept, id) end
  end
end
return kept
