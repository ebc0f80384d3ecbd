-- reconcile: replaces a started attempt's token estimate by the reported
-- usage where the reservation was counted (SPEC Q-5); token limits only.
-- Needs no clock. Arguments: stamp, estimate, actual, channel. Returns 1.
local stamp, estimate, actual, channel =
  tonumber(arg(1)), tonumber(arg(2)), tonumber(arg(3)), arg(4)
load()
for i = 1, N do
  local l = limits[i]
  if l.dim == "t" then
    l.algo.reconcile(l, l.state, stamp, estimate, actual)
    save_one(i)
  end
end
if actual < estimate then publish(channel) end
return 1
