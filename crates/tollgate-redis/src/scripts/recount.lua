-- recount: the provider counted a leased reservation no later than `ago`
-- microseconds before the store's now (SPEC Q-15); it stays counted until
-- one window after that instant. Arguments: stamp, ago, epoch tag.
-- Returns the stamp that now locates it (unchanged for a reservation of an
-- earlier epoch).
local again = replayed()
if again then return again end
local stamp, ago = tonumber(arg(1)), tonumber(arg(2))
local now = clock()
if not current(tonumber(arg(3))) then return stamp end
local at = max(0, now - ago)
-- Recorded: a repeat reads a later now, and must not move it then.
if at <= stamp then return done(stamp) end
load()
advance(now)
if expire_holds(now) then publish() end
local moved = stamp
for i = 1, N do
  local l = limits[i]
  moved = max(moved, l.algo.recount(l, l.state, stamp, l.amount, at, now))
end
save()
return done(moved)
