-- debt: a reservation taken before a reload added limits (SPEC GW-15) was
-- settled through the limits that counted it; each limit named here (one
-- the reload added) settles it as the in-process store settles a
-- reservation from before a limit's start (`LimitState::foreign`): it
-- counts `to` where it counted `counted` at the reservation's instant
-- (the algorithm's reconcile: a debt or a recount from there has
-- `counted` 0, a usage of a reservation the limit took as its own, or a
-- refusal's give-back, its estimate), or, given `from`, moves `counted`
-- from instant `from` to the reservation's (the algorithm's recount).
-- Each limit's amount is 0.
-- Arguments: stamp, epoch tag, from (-1 for none), then each limit's
-- `counted` and `to` (0 and 0 for no change; a limit past them changes
-- nothing).
-- Returns 1.
local again = replayed()
if again then return again end
local stamp, from = tonumber(arg(1)), tonumber(arg(3))
local now = clock()
if not current(tonumber(arg(2))) then return 1 end
load()
advance(now)
local back = expire_holds(now)
for i = 1, N do
  local l = limits[i]
  local counted = tonumber(arg(2 + 2 * i) or "0") or 0
  local to = tonumber(arg(3 + 2 * i) or "0") or 0
  if from >= 0 then
    if counted > 0 then l.algo.recount(l, l.state, from, counted, stamp, now) end
  elseif counted ~= to then
    l.algo.reconcile(l, l.state, stamp, counted, to)
    if to < counted then back = true end
  end
end
save()
if back then publish() end
return done(1)
