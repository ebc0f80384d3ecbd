-- refund: restores a reservation whose attempt never started, in full
-- (SPEC Q-9). Arguments: stamp, hold ("p" or "l"), channel. Returns 1.
local stamp, pending, channel = tonumber(arg(1)), arg(2) == "p", arg(3)
local now = clock()
load()
advance(now)
for i = 1, N do
  local l = limits[i]
  l.algo.refund(l, l.state, stamp, l.amount, pending)
end
save()
publish(channel)
return 1
