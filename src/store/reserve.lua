
-- reserve: slots for the next requests of a lane, all its gates at once.
-- KEYS: the lane's gates. ARGV: clock override (0: Redis TIME), headroom,
-- horizon (no slot further ahead), keep (how long an idle gate's state
-- matters), n, n costs, then the gate specs.
-- Returns { now, hold, paused, seqs (one per key)..., waits (one per slot)... }:
-- `hold` > 0 is when the next slot would be, beyond the horizon (nothing
-- was charged for it); `paused` is the latest pause in force.
clock_now = clock(ARGV[1])
local now = clock_now
local headroom = tonumber(ARGV[2])
local horizon = tonumber(ARGV[3])
local keep = tonumber(ARGV[4])
local n = tonumber(ARGV[5])
local costs = {}
for k = 1, n do costs[k] = tonumber(ARGV[5 + k]) end
local gates = read_specs(#KEYS, 6 + n)

local paused = 0
for k, key in ipairs(KEYS) do
  load(key, gates[k], now)
  paused = math.max(paused, gates[k].paused)
end

local waits, hold, last = {}, 0, now
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
    gate.seq = gate.seq + 1
  end
  waits[#waits + 1] = t - now
  last = t
  -- First in, first out: the next slot is never before this one.
  from = t
end

local reply = { now, hold, paused }
for k, key in ipairs(KEYS) do
  if #waits > 0 then save(key, gates[k], math.max(last, paused) + keep, now) end
  reply[#reply + 1] = gates[k].seq
end
for _, wait in ipairs(waits) do reply[#reply + 1] = wait end
return reply
