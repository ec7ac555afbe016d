-- Which command of the scripts' the store's user may not run, checked once
-- when a store connects, so a missing ACL permission is named at startup
-- instead of failing the first request with a message that names none.
-- KEYS: a key under the store's prefix. ARGV: the pause channel.
-- Returns the first command refused, or false. Redis before 7 has no
-- `acl_check_cmd`: nothing to check there, false.
if not redis.acl_check_cmd then
  return false
end
local key, channel = KEYS[1], ARGV[1]
local uses = {
  {'EXISTS', key}, {'HEXISTS', key, 'f'}, {'HGET', key, 'f'},
  {'HMGET', key, 'f'}, {'HSET', key, 'f', '0'}, {'PEXPIRE', key, '1'},
  {'PTTL', key}, {'PUBLISH', channel, ''}, {'TIME'},
}
for _, use in ipairs(uses) do
  if not redis.acl_check_cmd(unpack(use)) then
    return string.lower(use[1])
  end
end
return false
