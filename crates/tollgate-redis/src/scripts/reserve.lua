-- reserve: takes every limit's amount at the store's now, all or nothing
-- (SPEC Q-1), or tells when the amounts fit (SPEC Q-4); nothing while the
-- scope's cooldown runs (its end is the wait, no dimension short).
-- Arguments: hold ("p" pending, "l" leased); for a pending hold, its id
-- and how long it lives (microseconds) unless leased or given back.
-- Returns {1, now, the epoch's tag} when granted; {0, wait, requests, tokens, input tokens,
-- output tokens, cost} when not: wait in microseconds from now (-1: only a
-- pending reservation's lease, refund or expiry can make room), and which
-- dimensions were short (0/1).
local again = replayed()
if again then return again end
local pending = arg(1) == "p"
local now = clock()
-- A cooldown after a provider 429 pauses every process (SPEC DQ-9).
if META[4] and META[4] > now then return { 0, META[4] - now, 0, 0, 0, 0, 0 } end
load()
advance(now)
if expire_holds(now) then publish() end
local fits = true
for i = 1, N do
  local l = limits[i]
  if not l.algo.fits(l, l.state, l.amount) then fits = false end
end
if fits then
  for i = 1, N do
    local l = limits[i]
    l.algo.add(l, l.state, l.amount, now, pending)
  end
  if pending then keep_hold(arg(2), now, now + tonumber(arg(3))) end
  save()
  return done({ 1, now, tag() })
end
-- The advanced state is kept, as the in-process store keeps it: a later
-- reconciliation lands on the bucket as of its last refill.
save()
local at = nil
local short = { r = 0, t = 0, i = 0, o = 0, c = 0 }
for i = 1, N do
  local l = limits[i]
  if not l.algo.fits(l, l.state, l.amount) then
    short[l.dim] = 1
    -- A known instant is still a useful lower bound when another limit
    -- waits on a pending lease: the waiter re-checks then.
    local e = l.algo.earliest(l, l.state, l.amount, now)
    if e then
      if at then at = max(at, e) else at = e end
    end
  end
end
local wait = -1
if at then wait = at - now end
return { 0, wait, short.r, short.t, short.i, short.o, short.c }
