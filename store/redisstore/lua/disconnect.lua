-- ARGV: prefix, id, cause (0 closed, 1 expired, 2 lost), ttl ms, grace ms.
local out = new_out()
if ARGV[3] == '1' then
  -- Expired by its node: report it, with how late past its deadline.
  local dl = redis.call('ZSCORE', DL, ARGV[2])
  if dl then
    table.insert(out.expired, ARGV[2])
    table.insert(out.lags, math.max(0, NOW_MS - tonumber(dl)))
  end
end
if not remove(ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), out) then
  return redis.error_reply('UNKNOWN connection')
end
return reply(out)
