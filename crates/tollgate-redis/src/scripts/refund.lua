-- refund: restores a leased reservation whose attempt never started, in
-- full (SPEC Q-9); pending holds are given back by `forget`. Arguments:
-- stamp, epoch tag. Returns 1.
local again = replayed()
if again then return again end
local stamp = tonumber(arg(1))
local now = clock()
if not current(tonumber(arg(2))) then return 1 end
load()
advance(now)
expire_holds(now)
for i = 1, N do
  local l = limits[i]
  l.algo.refund(l, l.state, stamp, l.amount, false)
end
save()
publish()
return done(1)
