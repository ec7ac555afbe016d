-- callshaper's meters, in Lua, run inside Redis: the arithmetic of
-- src/meters/*.rs on microseconds of Redis time, so a fleet reserves from one
-- state with one clock. Every script starts with this file.
--
-- A lane's gates are hashes (one per gate, all under one hash tag, so one
-- shard holds them). Fields: `o` origin of the gate's windows, `p` paused
-- until, `n` reservations so far (the give-back guard), `q` the pace's
-- theoretical arrival time, `m1`, `m2`, ... each meter's state (msgpack);
-- the vendor's gate also `f`, the fleet's lanes for the fair share (see
-- reserve.lua).
--
-- Gate specs arrive flat in ARGV, from `at`: for each key, the pace interval
-- (0: none) and the number of meters, then per meter its algorithm
-- (1 leaky bucket, 2 token bucket, 3 fixed window, 4 sliding log,
-- 5 sliding window), unit (0 requests, 1 cost), count, window (per +
-- headroom, us) and capacity.

-- Redis time of the running script (us); set by each script first.
local clock_now = 0

local function clock(override)
  local t = tonumber(override)
  if t and t > 0 then return t end
  local time = redis.call('TIME')
  return tonumber(time[1]) * 1000000 + tonumber(time[2])
end

local function ceil_div(a, b)
  return math.floor((a + b - 1) / b)
end

-- Read the gate specs starting at ARGV[at]; returns them and the next index.
local function read_specs(nkeys, at)
  local gates = {}
  for k = 1, nkeys do
    local gate = { pace = tonumber(ARGV[at]), meters = {} }
    local m = tonumber(ARGV[at + 1])
    at = at + 2
    for j = 1, m do
      local count = tonumber(ARGV[at + 2])
      local window = tonumber(ARGV[at + 3])
      gate.meters[j] = {
        alg = tonumber(ARGV[at]), unit = tonumber(ARGV[at + 1]),
        count = count, window = window, capacity = tonumber(ARGV[at + 4]),
        interval = ceil_div(window, count),
      }
      at = at + 5
    end
    gates[k] = gate
  end
  return gates, at
end

local function load(key, gate, now)
  local fields = { 'o', 'p', 'n', 'q' }
  for j = 1, #gate.meters do fields[#fields + 1] = 'm' .. j end
  local values = redis.call('HMGET', key, unpack(fields))
  -- No origin: no state at all (new, expired, or lost).
  gate.fresh = not values[1]
  gate.origin = tonumber(values[1]) or now
  gate.paused = tonumber(values[2]) or 0
  gate.seq = tonumber(values[3]) or 0
  gate.pace_tat = tonumber(values[4])
  for j, meter in ipairs(gate.meters) do
    local state = values[4 + j]
    meter.state = state and cmsgpack.unpack(state) or {}
  end
end

local function save(key, gate, expire_at, now)
  local args = { 'o', gate.origin, 'p', gate.paused, 'n', gate.seq }
  if gate.pace_tat then
    args[#args + 1] = 'q'; args[#args + 1] = gate.pace_tat
  end
  for j, meter in ipairs(gate.meters) do
    args[#args + 1] = 'm' .. j
    args[#args + 1] = cmsgpack.pack(meter.state)
  end
  redis.call('HSET', key, unpack(args))
  -- Idle gates leave: once nothing is reserved and no window remembers
  -- anything, the state is the same as none.
  redis.call('PEXPIRE', key, math.max(1, ceil_div(expire_at - now, 1000)))
end

local function units(meter, cost)
  if meter.unit == 1 then return cost end
  return 1
end

local function window_index(gate, meter, t)
  if t <= gate.origin then return 0 end
  return math.floor((t - gate.origin) / meter.window)
end

local function window_start(gate, meter, i)
  return gate.origin + i * meter.window
end

-- Fixed window state: { index1, spent1, index2, spent2, ... }, windows with
-- reservations, oldest first (a reservation may land in a later window).
local function fixed_spent(meter, i)
  local s = meter.state
  for x = 1, #s, 2 do
    if s[x] == i then return s[x + 1] end
  end
  return 0
end

-- Sliding window estimate of the window containing `t`'s index `i`.
local function sliding_counts(meter, i)
  local s = meter.state -- { index, previous, current }
  local at = s[1]
  if not at then return 0, 0 end
  if i == at then return s[2], s[3] end
  if i == at + 1 then return s[3], 0 end
  return 0, 0
end

local function sliding_fits(gate, meter, i, previous, room)
  local start = window_start(gate, meter, i)
  if previous == 0 or room >= previous then return start end
  local elapsed = 1 - room / previous
  return start + math.ceil(meter.window * elapsed) + 1
end

-- When `meter` allows `c` units, at `t` or later.
local function earliest(gate, meter, c, t, headroom)
  local s = meter.state
  if meter.alg == 1 then
    local tat = s[1]
    if tat and tat > t then return tat end
    return t
  elseif meter.alg == 2 then
    local tat = s[1]
    if not tat then return t end
    -- Less half the headroom: a late burst cannot crowd the refill
    -- (see token_bucket.rs).
    local tolerance = meter.interval * math.max(0, meter.capacity - c) - math.floor(headroom / 2)
    return math.max(t, tat - math.max(0, tolerance))
  elseif meter.alg == 3 then
    local i = window_index(gate, meter, t)
    if c > meter.count then return t end
    while fixed_spent(meter, i) + c > meter.count do i = i + 1 end
    return math.max(t, window_start(gate, meter, i))
  elseif meter.alg == 4 then
    -- Entries are kept in time order, and a new one never goes before the
    -- last: then the window ending at the new entry is the fullest one
    -- that contains it, and checking it is exact.
    local n = #s
    if n > 0 and s[n - 1] > t then t = s[n - 1] end
    local total = 0
    for x = 2, n, 2 do total = total + s[x] end
    if total + c <= meter.count then return t end
    for x = 1, n, 2 do
      total = total - s[x + 1]
      if total + c <= meter.count then return math.max(t, s[x] + meter.window) end
    end
    return t
  else
    -- Sliding window counter, never before the window it last counted in.
    if s[1] then t = math.max(t, window_start(gate, meter, s[1])) end
    local i = window_index(gate, meter, t)
    local previous, current = sliding_counts(meter, i)
    if current + c <= meter.count then
      return math.max(t, sliding_fits(gate, meter, i, previous, meter.count - current - c))
    end
    return math.max(t, sliding_fits(gate, meter, i + 1, current, math.max(0, meter.count - c)))
  end
end

local function commit(gate, meter, c, t, headroom)
  local s = meter.state
  if meter.alg == 1 then
    local tat = s[1]
    -- On schedule, or late by no more than half the headroom: keep the
    -- schedule (see leaky_bucket.rs).
    local base = t
    if tat and t <= tat + math.floor(headroom / 2) then base = tat end
    meter.state = { base + meter.interval * c }
  elseif meter.alg == 2 then
    local base = math.max(s[1] or t, t)
    meter.state = { base + meter.interval * c }
  elseif meter.alg == 3 then
    local i = window_index(gate, meter, t)
    local live = window_index(gate, meter, clock_now)
    local kept, found = {}, false
    for x = 1, #s, 2 do
      if s[x] >= live then
        local spent = s[x + 1]
        if s[x] == i then spent = spent + c; found = true end
        kept[#kept + 1] = s[x]; kept[#kept + 1] = spent
      end
    end
    if not found then
      -- Keep windows in order.
      local ordered, placed = {}, false
      for x = 1, #kept, 2 do
        if not placed and kept[x] > i then
          ordered[#ordered + 1] = i; ordered[#ordered + 1] = c; placed = true
        end
        ordered[#ordered + 1] = kept[x]; ordered[#ordered + 1] = kept[x + 1]
      end
      if not placed then ordered[#ordered + 1] = i; ordered[#ordered + 1] = c end
      kept = ordered
    end
    meter.state = kept
  elseif meter.alg == 4 then
    local kept = {}
    for x = 1, #s, 2 do
      if s[x] + meter.window > clock_now then
        kept[#kept + 1] = s[x]; kept[#kept + 1] = s[x + 1]
      end
    end
    kept[#kept + 1] = t; kept[#kept + 1] = c
    meter.state = kept
  else
    local i = window_index(gate, meter, t)
    local previous, current = sliding_counts(meter, i)
    meter.state = { i, previous, current + c }
  end
end

-- Correct a charge of `charged` units at `t` to `actual` (0: give it back).
local function settle(gate, meter, charged, actual, t)
  local s = meter.state
  if meter.alg == 1 or meter.alg == 2 then
    if s[1] then s[1] = s[1] - meter.interval * (charged - actual) end
  elseif meter.alg == 3 then
    local i = window_index(gate, meter, t)
    for x = 1, #s, 2 do
      if s[x] == i then s[x + 1] = math.max(0, s[x + 1] + actual - charged) end
    end
  elseif meter.alg == 4 then
    -- The entry of that release: its units match, its time is the nearest.
    local best, distance = nil, nil
    for x = 1, #s, 2 do
      if s[x + 1] == charged then
        local d = math.abs(s[x] - t)
        if not distance or d < distance then best, distance = x, d end
      end
    end
    if best then s[best + 1] = actual end
  else
    if not s[1] then return end
    local i = window_index(gate, meter, t)
    if i == s[1] then
      s[3] = math.max(0, s[3] + actual - charged)
    elseif i + 1 == s[1] then
      s[2] = math.max(0, s[2] + actual - charged)
    end
  end
end
