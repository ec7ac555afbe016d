
-- reserve: slots for the next requests of a lane, all its gates at once.
-- KEYS: the lane's gates. ARGV: clock override (0: Redis TIME), headroom,
-- horizon (no slot further ahead), keep (how long an idle gate's state
-- matters), booked (the latest slot this lane reserved, 0: none), me (the
-- lane's name in the fleet), waiting (requests waiting in the lane), n,
-- n costs, then the gate specs.
-- Returns { now, hold, paused, lost, seqs (one per key)..., waits (one per
-- slot)..., then per slot and key what the fleet booked in the key's window
-- ending at the slot (see `ledger_count`): count, when the oldest leaves
-- }: `hold` > 0 is when the next slot would be, beyond the horizon
-- (nothing was charged for it); `paused` is the latest pause in force;
-- `lost` is 1 when a gate's state was found lost.
clock_now = clock(ARGV[1])
local now = clock_now
local headroom = tonumber(ARGV[2])
local horizon = tonumber(ARGV[3])
local keep = tonumber(ARGV[4])
local booked = tonumber(ARGV[5])
local me = ARGV[6]
local waiting = tonumber(ARGV[7])
local n = tonumber(ARGV[8])
local costs = {}
for k = 1, n do costs[k] = tonumber(ARGV[8 + k]) end
local gates = read_specs(#KEYS, 9 + n)

-- Fair share. The vendor's gate keeps, in one field (`f`), when each lane
-- of the fleet last asked and how many requests it still had waiting
-- then; entries older than two horizons are dropped. While another lane
-- still waits, each call books one slot, so the lanes take turns and the
-- fleet serves requests close to the order they came in. A lane starting
-- a busy spell (it waited for nothing when it last asked) books one slot
-- too if others asked lately: a burst reaches every instance within
-- milliseconds, before any has said it waits. Otherwise a lane books its
-- whole batch.
local vendor = KEYS[#KEYS]
local fleet = redis.call('HGET', vendor, 'f')
fleet = fleet and cmsgpack.unpack(fleet) or {}
local recent, busy, mine = 0, 0, 0
for id, lane in pairs(fleet) do
  if id == me then
    mine = lane[2]
  elseif lane[1] < now - 2 * horizon then
    fleet[id] = nil
  else
    recent = recent + 1
    if lane[2] > 0 then busy = busy + 1 end
  end
end
if n > 1 and (busy > 0 or (mine == 0 and recent > 0) or booked == 0) then n = 1 end

local paused = 0
for k, key in ipairs(KEYS) do
  load(key, gates[k], now)
  paused = math.max(paused, gates[k].paused)
end

-- This lane reserved a slot at `booked`, and every write keeps a gate's
-- state at least `keep` past its latest slot: a gate found empty before
-- then did not expire, it lost its state (FLUSHALL, a failover to a
-- replica that missed the writes, an eviction). Every instance may still
-- hold slots booked up to a horizon ahead, which the empty state no longer
-- counts: start it as if the window ending a horizon from now were full,
-- so none of them is handed out twice. A leaky bucket counting requests
-- needs only its last slot there; the others a whole window.
local lost = 0
if booked > 0 and now < booked + keep then
  local at = now + horizon
  for _, gate in ipairs(gates) do
    if gate.fresh then
      lost = 1
      for _, meter in ipairs(gate.meters) do
        local full = meter.count
        if meter.alg == 1 and meter.unit == 0 then full = 1 end
        if meter.alg == 2 then full = meter.capacity end
        commit(gate, meter, full, at, headroom)
      end
      if gate.pace > 0 then gate.pace_tat = at + gate.pace end
    end
  end
end

local waits, tally, hold, last = {}, {}, 0, now
local from = math.max(now, paused)
for slot = 1, n do
  local cost = costs[slot]
  -- The first instant every meter of every gate allows this request: each
  -- meter's answer can only move it later, so repeat until none does.
  local t = from
  for _ = 1, 16 do
    local latest = t
    for _, gate in ipairs(gates) do
      if gate.pace > 0 and gate.pace_tat and gate.pace_tat > latest then latest = gate.pace_tat end
      for _, meter in ipairs(gate.meters) do
        latest = math.max(latest, earliest(gate, meter, units(meter, cost), t, headroom))
      end
    end
    if latest == t then break end
    t = latest
  end
  if t > now + horizon then
    hold = t
    break
  end
  for _, gate in ipairs(gates) do
    for _, meter in ipairs(gate.meters) do commit(gate, meter, units(meter, cost), t, headroom) end
    if gate.pace > 0 then gate.pace_tat = math.max(gate.pace_tat or t, t) + gate.pace end
    ledger_add(gate, t, 1)
    gate.seq = gate.seq + 1
    local count, leaves = ledger_count(gate, t)
    tally[#tally + 1] = count
    tally[#tally + 1] = leaves
  end
  waits[#waits + 1] = t - now
  last = t
  -- First in, first out: the next slot is never before this one.
  from = t
end

-- This lane asked now, and what it still has waiting, where the others
-- look (only on a gate that exists: a record alone would read as a gate
-- that lost its state).
if #waits > 0 or lost == 1 or redis.call('EXISTS', vendor) == 1 then
  fleet[me] = { now, math.max(0, waiting - #waits) }
  redis.call('HSET', vendor, 'f', cmsgpack.pack(fleet))
end

local reply = { now, hold, paused, lost }
for k, key in ipairs(KEYS) do
  if #waits > 0 then
    save(key, gates[k], math.max(last, paused) + keep, now)
  elseif lost == 1 then
    -- The state started over matters until its full horizon has passed.
    save(key, gates[k], math.max(paused, now + horizon) + keep, now)
  end
  reply[#reply + 1] = gates[k].seq
end
for _, wait in ipairs(waits) do reply[#reply + 1] = wait end
for _, n in ipairs(tally) do reply[#reply + 1] = n end
return reply
