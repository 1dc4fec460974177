-- KEYS: one shard's webhook stream (wh). ARGV: group, n, the n other
-- groups reading the stream (other webhook formats), entry id...
-- Acknowledges the entries for group, and deletes each that no other group
-- still has to deliver: one it has not read yet (after its last delivered
-- id) or holds pending. The last group done with an entry deletes it, and
-- in one atomic step, so no group loses an entry to another's delete. A
-- group not on the stream is not waited for (it is made before its node
-- reads). Returns how many were deleted.
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local group, n = ARGV[1], tonumber(ARGV[2])
local wanted = {}
for i = 3, 2 + n do wanted[ARGV[i]] = true end
local last = {} -- other group -> its last delivered id, as {ms, seq}
local function parse(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return {tonumber(ms), tonumber(seq)}
end
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local name, ld
  for j = 1, #g, 2 do
    if g[j] == 'name' then name = g[j + 1] elseif g[j] == 'last-delivered-id' then ld = g[j + 1] end
  end
  if name and ld and wanted[name] then last[name] = parse(ld) end
end
local deleted = 0
for i = 3 + n, #ARGV do
  local id = ARGV[i]
  redis.call('XACK', KEYS[1], group, id)
  local e = parse(id)
  local keep = false
  for name, ld in pairs(last) do
    if ld[1] < e[1] or (ld[1] == e[1] and ld[2] < e[2])
        or #redis.call('XPENDING', KEYS[1], name, id, id, 1) > 0 then
      keep = true
      break
    end
  end
  if not keep then deleted = deleted + redis.call('XDEL', KEYS[1], id) end
end
return deleted
