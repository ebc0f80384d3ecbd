-- observe: what a provider's answer said about the shared budget (SPEC
-- Q-14, DQ-9), taken into the shortest sliding window of each reported
-- dimension, transitional limits aside (see S.observe). A limit's amount is the answered attempt's.
-- Arguments: the attempt's lease instant, the instant the log counts it
-- at (after its recount), how long before the store's now its response
-- began (microseconds; no earlier than the second), how long after the
-- lease's answer arrived it began (microseconds), its epoch tag, k, then
-- k times:
-- dimension ("r", "t", "i", "o"), remaining (-1: not reported), reset
-- (microseconds, 0: none). Returns 2k numbers: per report, the units
-- taken and given back.
local again = replayed()
if again then return again end
local sent, at, ago = tonumber(arg(1)), tonumber(arg(2)), tonumber(arg(3))
local lead, k = tonumber(arg(4)), tonumber(arg(6))
local now = clock()
local out = {}
for j = 1, 2 * k do out[j] = 0 end
-- An attempt of an earlier epoch: its instants mean nothing now.
if not current(tonumber(arg(5))) then return done(out) end
load()
advance(now)
if expire_holds(now) then publish() end
local counted = max(at, now - ago)
-- How late this store's instants of a replica's response run: `now - ago`
-- is late by the trip to the store, `sent + lead` early by the lease's
-- answer's trip back, so their difference is about one round trip. A
-- response recorded up to four such round trips after this attempt's
-- lease may have begun before it (the trips of other operations vary).
local slack = 4 * max(0, now - ago - sent - lead)
for j = 1, k do
  local b = 6 + 3 * (j - 1)
  local dim, remaining, reset = arg(b + 1), tonumber(arg(b + 2)), tonumber(arg(b + 3))
  local l = nil
  for i = 1, N do
    local c = limits[i]
    -- Not a transitional limit (it goes after one of its windows).
    if c.kind == "s" and c.dim == dim and c.src >= 0 and (l == nil or c.window < l.window) then
      l = c
    end
  end
  if l and remaining >= 0 then
    out[2 * j - 1], out[2 * j] = S.observe(l, l.state, remaining, l.amount, sent + slack, at, counted, reset, now)
  end
end
save()
for j = 1, k do
  if out[2 * j] > 0 then
    publish()
    break
  end
end
return done(out)
