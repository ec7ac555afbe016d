
-- pause: every gate of the lane stops until now + pause, fleet-wide; a pause
-- only moves forward. Tells every instance at once on the pause channel.
-- KEYS: the gates. ARGV: clock override, pause (us), keep, channel.
-- Returns how long the latest pause lasts from now (us).
clock_now = clock(ARGV[1])
local now = clock_now
local pause = tonumber(ARGV[2])
local keep = tonumber(ARGV[3])
local longest = 0
for _, key in ipairs(KEYS) do
  local until_ = math.max(tonumber(redis.call('HGET', key, 'p')) or 0, now + pause)
  redis.call('HSET', key, 'p', until_)
  if redis.call('HEXISTS', key, 'o') == 0 then redis.call('HSET', key, 'o', now) end
  local ttl = redis.call('PTTL', key)
  redis.call('PEXPIRE', key, math.max(ttl, ceil_div(until_ - now + keep, 1000)))
  redis.call('PUBLISH', ARGV[4], key .. '\n' .. (until_ - now))
  longest = math.max(longest, until_ - now)
end
return longest
