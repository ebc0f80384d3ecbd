-- debt: a reservation taken before a reload added limits (SPEC GW-15) was
-- settled through the limits that counted it; each limit given a debt
-- here (one the reload added, which never counted the reservation) counts
-- that much from the reservation's instant and gives nothing back, as the
-- in-process store settles a reservation from before a limit's start
-- (`LimitState::foreign`). Each limit's amount is 0.
-- Arguments: stamp, epoch tag, then each limit's debt (0 for none; a
-- limit past them takes none).
-- Returns 1.
local again = replayed()
if again then return again end
local stamp = tonumber(arg(1))
local now = clock()
if not current(tonumber(arg(2))) then return 1 end
load()
advance(now)
if expire_holds(now) then publish() end
for i = 1, N do
  local l = limits[i]
  local debt = tonumber(arg(2 + i) or "0") or 0
  if debt > 0 then l.algo.reconcile(l, l.state, stamp, 0, debt) end
end
save()
return done(1)
