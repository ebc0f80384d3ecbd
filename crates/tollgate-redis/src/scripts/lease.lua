-- lease: a pending reservation's attempt starts; its amounts move to the
-- store's now. Arguments: stamp. Returns the new stamp (now).
local stamp = tonumber(arg(1))
local now = clock()
load()
advance(now)
for i = 1, N do
  local l = limits[i]
  l.algo.lease(l, l.state, stamp, l.amount, now)
end
save()
return now
