-- reconcile: replaces a started attempt's token estimates by the reported
-- usage where the reservation was counted (SPEC Q-5), each token limit
-- from its own dimension's figure (SPEC Q-12), and its worst-case cost by
-- the priced usage (SPEC BUD-2); request limits are never touched. Needs
-- no clock. Each limit's amount is its estimate.
-- Arguments: stamp, then the actual tokens, input tokens, output tokens
-- and cost (an unknown split or cost is passed as the estimate), then the
-- epoch tag.
-- Returns 1.
local again = replayed()
if again then return again end
local stamp = tonumber(arg(1))
if not current(tonumber(arg(6))) then return 1 end
local actuals = {
  t = tonumber(arg(2)), i = tonumber(arg(3)), o = tonumber(arg(4)), c = tonumber(arg(5)),
}
-- Gives back no expired hold: keeps the holds' keys as long as the state.
REFRESH_HOLDS = true
load()
local back = false
for i = 1, N do
  local l = limits[i]
  local actual = actuals[l.dim]
  if actual and actual ~= l.amount then
    l.algo.reconcile(l, l.state, stamp, l.amount, actual)
    save_one(i)
    if actual < l.amount then back = true end
  end
end
if back then publish() end
return done(1)
