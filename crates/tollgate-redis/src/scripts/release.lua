-- release: gives back what a refused attempt took from the chosen
-- dimensions (SPEC Q-16); a limit's amount is 0 when its dimension is not
-- chosen. Needs no clock. Arguments: stamp, epoch tag. Returns 1.
local again = replayed()
if again then return again end
local stamp = tonumber(arg(1))
if not current(tonumber(arg(2))) then return 1 end
-- Gives back no expired hold: keeps the holds' keys as long as the state.
REFRESH_HOLDS = true
load()
local given = false
for i = 1, N do
  local l = limits[i]
  if l.amount > 0 then
    l.algo.release(l, l.state, stamp, l.amount)
    save_one(i)
    given = true
  end
end
if given then publish() end
return done(1)
