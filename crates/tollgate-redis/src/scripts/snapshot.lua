-- snapshot: every limit's available units at the store's now (negative
-- while in debt), in configuration order. Keeps the advanced state (and
-- gives back expired pending holds), as the in-process store does.
local now = clock()
load()
advance(now)
if expire_holds(now) then publish() end
save()
local out = {}
for i = 1, N do
  local l = limits[i]
  out[i] = l.algo.available(l, l.state)
end
return out
