-- KEYS: the shard's (prelude) and the user's (KEYS[13] to KEYS[16]). ARGV:
-- user, mode (0 auto, 1 dnd, 2 invisible), text, emoji, expires ms (0:
-- none). Replaces the user's status whole (set_status in the prelude); the
-- node checked it against the contract.
local uk = given_user(ARGV[1])
local out = new_out()
set_status(uk, tonumber(ARGV[2]), ARGV[3], ARGV[4], tonumber(ARGV[5]), out)
return reply(out)
