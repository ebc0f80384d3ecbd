-- reconcile: replaces a started attempt's token estimate by the reported
-- usage where the reservation was counted (SPEC Q-5); token limits only.
-- Needs no clock. Arguments: stamp, estimate, actual. Returns 1.
local stamp, estimate, actual = tonumber(arg(1)), tonumber(arg(2)), tonumber(arg(3))
-- Gives back no expired hold: keeps the holds' keys as long as the state.
REFRESH_HOLDS = true
load()
for i = 1, N do
  local l = limits[i]
  if l.dim == "t" then
    l.algo.reconcile(l, l.state, stamp, estimate, actual)
    save_one(i)
  end
end
if actual < estimate then publish() end
return 1
