-- A team's present members as its Pusher webhooks tell them, for
-- channel_occupied and channel_vacated (occupancy.go). KEYS[1]: the team's
-- record (oc), in the team's slot: n, the count of members present; per
-- member u:<user> = "version:present" of the last event counted (or
-- "version:0[:1]" of the removal from the team, member_team.lua; :1 when
-- it took the member out of the count); r:<user> the answers this script
-- gave the user's events that occupied or vacated the team, so that a
-- retry, or another node claiming the event, gets the same answer.
-- ARGV: user, version, present (1/0), checked (0: not yet; 1: with the
-- team's members from the truth after it, as triples user, version,
-- present; 2: the team is too large to read, decide on the count).
-- Reply: 1 the event occupies the team, -1 it vacates it, 0 neither;
-- 'check' when it is a leave that leaves at most one member counted and
-- came without the truth: the caller reads the team's members and calls
-- again.
local oc, user, v, p = KEYS[1], ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])

-- A member's record: version (a number, and as written: versions pass
-- 10^14, which Lua prints in floating point), present,
-- and whether a removal took them out of the count.
local function rec(u)
  local s = redis.call('HGET', oc, 'u:' .. u)
  if not s then return 0, 0, false, '0' end
  local rv, rp, dropped = string.match(s, '^(%d+):(%d):?(%d?)$')
  return tonumber(rv) or 0, tonumber(rp) or 0, dropped == '1', rv or '0'
end

-- Kept for retries and claims: a user's events may be prepared on several
-- nodes while the receiver is down, so more than one answer may still be
-- asked for again; the last 64 are kept.
local function answer(r)
  local rs = redis.call('HGET', oc, 'r:' .. user) or ''
  local kept = {ARGV[2] .. '=' .. r}
  for item in string.gmatch(rs, '[^,]+') do
    if #kept < 64 then table.insert(kept, item) end
  end
  redis.call('HSET', oc, 'r:' .. user, table.concat(kept, ','))
  return r
end

local n = tonumber(redis.call('HGET', oc, 'n') or '0') or 0
local cv, cp, dropped, cvs = rec(user)
if v <= cv then
  -- Counted already (a retry, a claim) or overtaken: the answer given.
  local rs = redis.call('HGET', oc, 'r:' .. user) or ''
  for ver, r in string.gmatch(rs, '(%d+)=(-?%d)') do
    if ver == ARGV[2] then return tonumber(r) end
  end
  if dropped and p == 0 then
    -- A leave published before the removal that took the member out of
    -- the count: it is the leave that ended their presence in the team.
    redis.call('HSET', oc, 'u:' .. user, cvs .. ':0')
    if n == 0 then return answer(-1) end
  end
  return 0
end

-- A leave that leaves one member or none is checked: a count the record
-- got wrong (a missed leave, a missed removal) would else keep the team
-- occupied for good.
if ARGV[4] == '0' and p == 0 and cp == 1 and n <= 2 then
  return 'check'
end
if ARGV[4] == '1' then
  -- The truth mends a record that missed events (dropped from a full
  -- queue, lost with Redis's data, made after the members came): members
  -- present before this leave, and not counted, count; counted users who
  -- are no longer members (a removal the record missed) do not.
  local member = {}
  for i = 5, #ARGV - 2, 3 do
    local x, xv, xp = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
    member[x] = true
    if x ~= user and xv < v then
      local rv, rp = rec(x)
      if xv > rv then
        redis.call('HSET', oc, 'u:' .. x, ARGV[i + 1] .. ':' .. xp)
        n = n + xp - rp
      end
    end
  end
  local all = redis.call('HGETALL', oc)
  for i = 1, #all, 2 do
    local x = string.match(all[i], '^u:(.*)$')
    if x and x ~= user and not member[x] and string.match(all[i + 1], '^%d+:1$') then
      redis.call('HSET', oc, all[i], string.match(all[i + 1], '^(%d+):') .. ':0')
      n = n - 1
    end
  end
end

local after = n + p - cp
redis.call('HSET', oc, 'u:' .. user, ARGV[2] .. ':' .. p, 'n', after)
if n == 0 and after > 0 then return answer(1) end
if n > 0 and after == 0 then return answer(-1) end
return 0
