
-- settle: correct charges already made. ARGV: clock override, headroom,
-- mode (0: a cost correction, on the meters that count cost, as in memory;
-- 1: give back reservations nobody used, on every meter, only if no one
-- reserved after them; the fleet's ledger forgets them either way; 2: the
-- ledger alone forgets them, for slots before others the lane still
-- holds, which the meters must keep apart), the key's expected seqs
-- (mode 1), m, then m triples (time, charged, actual), latest first, then
-- the gate specs.
-- Returns the number of gates corrected.
clock_now = clock(ARGV[1])
local now = clock_now
local headroom = tonumber(ARGV[2])
local mode = tonumber(ARGV[3])
local give_back = mode == 1
local unsent = mode ~= 0
local at = 4
local expected = {}
for k = 1, #KEYS do expected[k] = tonumber(ARGV[at]); at = at + 1 end
local m = tonumber(ARGV[at])
local slots = {}
for x = 1, m do
  slots[x] = { tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3]) }
  at = at + 3
end
local gates = read_specs(#KEYS, at + 1)
local corrected = 0
for k, key in ipairs(KEYS) do
  local gate = gates[k]
  if redis.call('EXISTS', key) == 1 then
    load(key, gate, now)
    if unsent and gate.ledger then
      -- Never sent, whether or not the meters can take them back.
      for _, slot in ipairs(slots) do ledger_add(gate, slot[1], -1) end
      redis.call('HSET', key, 'l', ledger_pack(gate, now))
    end
    if mode == 0 or (give_back and gate.seq == expected[k]) then
      for _, slot in ipairs(slots) do
        for _, meter in ipairs(gate.meters) do
          if give_back then
            settle(gate, meter, units(meter, slot[2]), 0, slot[1])
          elseif meter.unit == 1 then
            settle(gate, meter, slot[2], slot[3], slot[1])
          end
        end
        if give_back and gate.pace > 0 and gate.pace_tat then
          gate.pace_tat = gate.pace_tat - gate.pace
        end
      end
      local ttl = redis.call('PTTL', key)
      -- A give-back is taken once: whatever comes next sees a new number.
      local args = { 'n', gate.seq + 1 }
      for _, meter in ipairs(gate.meters) do
        args[#args + 1] = meter.field
        args[#args + 1] = cmsgpack.pack(meter.state)
      end
      if gate.pace_tat then args[#args + 1] = 'q'; args[#args + 1] = gate.pace_tat end
      redis.call('HSET', key, unpack(args))
      if ttl > 0 then redis.call('PEXPIRE', key, ttl) end
      corrected = corrected + 1
    end
  end
end
return corrected
