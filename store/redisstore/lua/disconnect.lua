-- ARGV: prefix, id, cause (0 closed, 1 expired, 2 lost), ttl ms, grace ms.
local out = new_out()
if not remove(ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), out) then
  return redis.error_reply('UNKNOWN connection')
end
return reply(out)
