-- cool: a provider 429 answered an attempt leased at `sent` (SPEC CD-1,
-- CD-2, DQ-9): every reservation of the scope, from any process, is
-- refused until `length` after the store's now. A cooldown that started
-- after the attempt was leased (a later generation) makes it stale: it
-- neither starts nor extends one; a running cooldown that ends later is
-- kept. Arguments: sent, length (microseconds), epoch tag. Returns how
-- long the scope's cooldown runs from now (microseconds), -1 for none.
local again = replayed()
if again then return again end
local sent, length = tonumber(arg(1)), tonumber(arg(2))
local now = clock()
-- An attempt of an earlier epoch: as if leased now.
if not current(tonumber(arg(3))) then sent = now end
local ends, started = META[4] or 0, META[5] or -1
local function left()
  if ends > now then return ends - now end
  return -1
end
if sent < started then return done(left()) end
if ends >= now + length then return done(left()) end
META[4], META[5] = now + length, now
redis.call("SET", KEYS[1], cmsgpack.pack(META), "PXAT", expiry())
return done(length)
