-- lease: a pending reservation's attempt starts; its amounts move to the
-- store's now. Arguments: the hold's id. Returns {the new stamp (now), the
-- epoch's tag}, or {-1} when the hold is no longer there (it expired or was given back):
-- then nothing is leased, and what any limit still held of it is given
-- back.
local again = replayed()
if again then return again end
local id = arg(1)
local now = clock()
load()
advance(now)
local gave = expire_holds(now)
local found = find_hold(id)
if not found then
  for i = 1, N do
    if drop_hold(limits[i], id) then gave = true end
  end
  save()
  if gave then publish() end
  return done({ -1 })
end
forget_hold(id)
for i = 1, N do
  local l = limits[i]
  l.algo.lease(l, l.state, found[i].tick, found[i].amount, now)
end
save()
if gave then publish() end
return done({ now, tag() })
