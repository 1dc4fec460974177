-- A team's present members as its Pusher webhooks tell them, for
-- channel_occupied and channel_vacated (occupancy.go). KEYS[1]: the team's
-- record (oc), in the team's slot: n, the count of members present; per
-- member u:<user> = "version:present" of the last event applied (or of the
-- removal from the team, member_team.lua); r:<user> the last few results
-- this script gave the user's events, so that a retry, or another node
-- claiming the event, gets the same answer.
-- ARGV: user, version, present (1/0), checked (1/0), then, when checked,
-- the team's members read from the truth as triples user, version, present.
-- Reply: 1 the event occupies the team, -1 it vacates it, 0 neither;
-- 'check' when it would do either and no truth came with it: the caller
-- reads the team and calls again with it.
local oc, user, v, p = KEYS[1], ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])

local function rec(u)
  local s = redis.call('HGET', oc, 'u:' .. u)
  if not s then return 0, 0 end
  local rv, rp = string.match(s, '^(%d+):(%d)$')
  return tonumber(rv) or 0, tonumber(rp) or 0
end

local cv, cp = rec(user)
if v <= cv then
  -- Applied already (a retry) or overtaken: the answer given, if any.
  local rs = redis.call('HGET', oc, 'r:' .. user) or ''
  for ver, r in string.gmatch(rs, '(%d+)=(-?%d)') do
    if ver == ARGV[2] then return tonumber(r) end
  end
  return 0
end

local n = tonumber(redis.call('HGET', oc, 'n') or '0') or 0
if ARGV[4] ~= '1' and ((n == 0 and p == 1 and cp == 0) or (n == 1 and p == 0 and cp == 1)) then
  return 'check'
end
if ARGV[4] == '1' then
  -- The truth catches the record up with members whose events it has not
  -- seen (dropped from a full queue, lost with Redis's data, or from
  -- before the record existed), as of before this event: only states
  -- older than it count; newer ones are still to come as events.
  for i = 5, #ARGV - 2, 3 do
    local x, xv, xp = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
    if x ~= user and xv < v then
      local rv, rp = rec(x)
      if xv > rv then
        redis.call('HSET', oc, 'u:' .. x, ARGV[i + 1] .. ':' .. xp)
        n = n + xp - rp
      end
    end
  end
end

local before = math.max(n, 0)
local after = math.max(before + p - cp, 0)
redis.call('HSET', oc, 'u:' .. user, ARGV[2] .. ':' .. p, 'n', after)
local r = 0
if before == 0 and after > 0 then r = 1 elseif before > 0 and after == 0 then r = -1 end
if r ~= 0 then
  -- Kept for the retries of the last four: an event is retried while
  -- newer ones of the same user are delivered only across a node's death.
  local rs = redis.call('HGET', oc, 'r:' .. user) or ''
  local kept = {ARGV[2] .. '=' .. r}
  for item in string.gmatch(rs, '[^,]+') do
    if #kept < 4 then table.insert(kept, item) end
  end
  redis.call('HSET', oc, 'r:' .. user, table.concat(kept, ','))
end
return r
