-- KEYS: the shard's (prelude). Raises the shard's version floor (FL) above
-- every version the shard has published (they are at most Redis's clock in
-- microseconds) and returns it; every later version of the shard exceeds it
-- (prelude), even if the clock steps back. A resync sends what viewers
-- missed at this floor.
local f = math.max(NOW_US, num(redis.call('GET', FL))) + 1
redis.call('SET', FL, fmt(f))
return fmt(f)
