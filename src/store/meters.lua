-- callshaper's meters, in Lua, run inside Redis: the arithmetic of
-- src/meters/*.rs on microseconds of Redis time, so a fleet reserves from one
-- state with one clock. Every script starts with this file.
--
-- A lane's gates are hashes (one per gate, all under one hash tag, so one
-- shard holds them). Fields: `o` origin of the gate's windows, `p` paused
-- until, `n` reservations so far (the give-back guard), `q` the pace's
-- theoretical arrival time, `l` the fleet's ledger (see `ledger_add`),
-- and each meter's state (msgpack) under a name that spells its quota
-- (`m2:0:10:1000000:5`, see `read_specs`);
-- the vendor's gate also `f`, the fleet's lanes for the fair share (see
-- reserve.lua).
--
-- Gate specs arrive flat in ARGV, from `at`: for each key, the pace interval
-- (0: none) and the number of meters, then per meter its algorithm
-- (1 leaky bucket, 2 token bucket, 3 fixed window, 4 sliding log,
-- 5 sliding window), unit (0 requests, 1 cost), count, window (per +
-- headroom, us), capacity and per (us).

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
        -- A meter's state means something only to a meter of the same
        -- quota: an instance deployed with another (a leaky bucket become
        -- a token bucket, a sliding log a sliding window) must not read it
        -- as its own; a log's instants read as a window's index put the
        -- next slot centuries ahead, and the lane sent nothing while the
        -- old state lived. Named by its quota, a changed meter starts
        -- afresh. The headroom is left out: instances differing only in
        -- it share their meters.
        field = table.concat({ 'm' .. ARGV[at], ARGV[at + 1], ARGV[at + 2], ARGV[at + 5],
          ARGV[at + 4] }, ':'),
      }
      at = at + 6
    end
    gates[k] = gate
  end
  return gates, at
end

-- The fleet's ledger: how many slots the fleet booked on a gate, per tick
-- of a 32nd of the window a vendor's signal about the gate is read against
-- (the slowest request meter's, as `Gate::window`), kept for that window.
-- Each slot booked is told how many the fleet booked in the window ending
-- at it, as a lane in memory counts its own releases (`ledger_count`).
-- Stored as { tick length, index, count, index, count, ... }, indexes
-- ascending; a tick length that changed (another quota) starts afresh.
local LEDGER_TICKS = 32

-- The gate's ledger tick and window (us), or nil when no meter counts
-- requests.
local function ledger_tick(gate)
  local slowest
  for _, meter in ipairs(gate.meters) do
    if meter.unit == 0 and (not slowest
        or meter.count * slowest.window < slowest.count * meter.window) then
      slowest = meter
    end
  end
  if not slowest then return nil end
  return math.max(1, math.floor(slowest.window / LEDGER_TICKS)), slowest.window
end

-- Add `n` slots at `t` to the gate's ledger: 1 for a slot booked, -1 for
-- one that will never be sent (given back, or wasted when the give-back
-- came too late for the meters). Slots come in time order but for a few
-- (a give-back re-booked, another instance's burst): the search starts at
-- the end.
local function ledger_add(gate, t, n)
  local l = gate.ledger
  if not l then return end
  local i = math.floor(t / l[1])
  local x = #l - 1
  while x >= 2 and l[x] > i do x = x - 2 end
  if x >= 2 and l[x] == i then
    l[x + 1] = l[x + 1] + n
    if l[x + 1] <= 0 then
      table.remove(l, x)
      table.remove(l, x)
    end
  elseif n > 0 then
    table.insert(l, x + 2, i)
    table.insert(l, x + 3, n)
  end
end

-- What the fleet booked in the gate's window ending at `t`: the count (-1:
-- no ledger) and when the oldest of them leaves the window (-1: unknown).
-- Every tick that overlaps the window counts whole, so the count errs
-- high: towards "the fleet's own spending", which the meters keep within
-- the quota. The oldest is taken at the end of its tick, and never from
-- the tick the window starts in (its slots may be older than the window),
-- so a pause until it leaves errs long.
local function ledger_count(gate, t)
  local l = gate.ledger
  if not l then return -1, -1 end
  local tick, window = l[1], gate.window
  local first, last = math.floor((t - window) / tick), math.floor(t / tick)
  local c = gate.counted
  if c and c[1] == first and c[2] == last then
    -- The same ticks as the slot before, and the one booked since is in
    -- the last of them: a reservation's slots at a high rate share their
    -- ticks, and count at once.
    c[3] = c[3] + 1
    if last > first and not c[4] then c[4] = last end
  else
    local count, oldest = 0, nil
    local x = #l - 1
    while x >= 2 and l[x] >= first do
      if l[x] <= last then
        count = count + l[x + 1]
        if l[x] > first then oldest = l[x] end
      end
      x = x - 2
    end
    c = { first, last, count, oldest }
    gate.counted = c
  end
  if not c[4] then return c[3], -1 end
  return c[3], (c[4] + 1) * tick + window
end

local function ledger_load(gate, packed)
  local tick, window = ledger_tick(gate)
  gate.window = window
  gate.ledger = nil
  if not tick then return end
  local l = packed and cmsgpack.unpack(packed)
  gate.ledger = (l and l[1] == tick) and l or { tick }
end

-- The ledger as stored: ticks older than a window before now forgotten.
local function ledger_pack(gate, now)
  local l = gate.ledger
  local oldest = math.floor((now - gate.window) / l[1]) - 1
  local x = 2
  while x < #l and l[x] < oldest do x = x + 2 end
  if x > 2 then
    local kept = { l[1] }
    for y = x, #l do kept[#kept + 1] = l[y] end
    l = kept
  end
  return cmsgpack.pack(l)
end

local function load(key, gate, now)
  local fields = { 'o', 'p', 'n', 'q', 'l' }
  for _, meter in ipairs(gate.meters) do fields[#fields + 1] = meter.field end
  local values = redis.call('HMGET', key, unpack(fields))
  -- No origin: no state at all (new, expired, or lost).
  gate.fresh = not values[1]
  gate.origin = tonumber(values[1]) or now
  gate.paused = tonumber(values[2]) or 0
  gate.seq = tonumber(values[3]) or 0
  gate.pace_tat = tonumber(values[4])
  ledger_load(gate, values[5])
  for j, meter in ipairs(gate.meters) do
    local state = values[5 + j]
    meter.state = state and cmsgpack.unpack(state) or {}
  end
end

local function save(key, gate, expire_at, now)
  local args = { 'o', gate.origin, 'p', gate.paused, 'n', gate.seq }
  if gate.pace_tat then
    args[#args + 1] = 'q'; args[#args + 1] = gate.pace_tat
  end
  if gate.ledger then
    args[#args + 1] = 'l'; args[#args + 1] = ledger_pack(gate, now)
  end
  for _, meter in ipairs(gate.meters) do
    args[#args + 1] = meter.field
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
