-- Shared by every script (prepended to each): the scope's clock, the
-- per-limit state, the three algorithms of crates/tollgate/src/quota/
-- (sliding.rs, bucket.rs, fixed.rs), transcribed line by line, and the
-- pending holds.
--
-- KEYS[1]      the scope's meta key: {epoch, latest, until, cooldown end,
--              cooldown start} (cmsgpack; the cooldown's instants are the
--              store's, absent while none ever ran, SPEC CD-1, DQ-9)
-- KEYS[4i-2]   the state of limit i (cmsgpack)
-- KEYS[4i-1]   the slot log of limit i (a list; sliding window only)
-- KEYS[4i]     limit i's pending holds: a hash, id -> cmsgpack(tick, amount)
-- KEYS[4i+1]   the same holds' expiry instants: a sorted set, id -> instant
-- ARGV[1]      "" (use Redis TIME) or an explicit store time in microseconds
--              (tests only)
-- ARGV[2]      how long this caller needs the scope's keys to live, in
--              milliseconds (never shortens a longer life, see Lifetimes)
-- ARGV[3]      the scope's channel (notices that quota came back)
-- ARGV[4]      n, the number of limits
-- ARGV[5..]    8 values per limit: kind ("s" sliding, "b" bucket, "f"
--              fixed), window (microseconds; bucket: ticks), resolution
--              (sliding, microseconds) or tick length (bucket,
--              microseconds), limit, capacity, dimension ("r" requests,
--              "t" tokens, "i" input tokens, "o" output tokens), the
--              operation's amount, and the limit it is seeded from when
--              its state does not exist yet (1-based, 0 for none, -1: a
--              transitional limit itself; plus 2^20 while that limit also
--              floors it; see Seeds)
-- ARGV[5+8n..] the operation's own arguments
-- KEYS[4n+2]   the operation's marker, when it is named (SPEC DQ-6):
--              {prefix:scope}:op:<id>, its first answer
--
-- Every quantity is an integer below 2^53, so Lua's doubles hold it
-- exactly (the Rust side chooses units that keep it so).

local TTL = tonumber(ARGV[2])
local CHANNEL = ARGV[3]
local N = tonumber(ARGV[4])
local OP = 5 + 8 * N
local MARKER = KEYS[4 * N + 2]
-- How long a marker lives, in milliseconds: far longer than any retry or
-- resend of its operation takes to arrive (the engine retries within a
-- few timeouts, a client library within its own retry budget).
local MARKER_TTL = 300000

-- Whether writing a limit's state also refreshes its pending holds' TTL:
-- only scripts that give back no expired holds (they read no clock) set
-- it. Every other script gives back the holds whose expiry has come, and
-- a hold's keys outlive its expiry by a whole TTL (keep_hold), so a hold
-- is never lost with its keys while the state still counts it.
local REFRESH_HOLDS = false

local limits = {}
local pendxs = {}
for i = 1, N do
  local b = 5 + 8 * (i - 1)
  limits[i] = {
    key = KEYS[4 * i - 2],
    log = KEYS[4 * i - 1],
    pend = KEYS[4 * i],
    pendx = KEYS[4 * i + 1],
    kind = ARGV[b],
    window = tonumber(ARGV[b + 1]),
    res = tonumber(ARGV[b + 2]),
    limit = tonumber(ARGV[b + 3]),
    cap = tonumber(ARGV[b + 4]),
    dim = ARGV[b + 5],
    amount = tonumber(ARGV[b + 6]),
    src = tonumber(ARGV[b + 7]),
  }
  -- A source that still floors the new limit (see Seeds).
  if limits[i].src > 1048576 then
    limits[i].src = limits[i].src - 1048576
    limits[i].floor = true
  end
  pendxs[i] = limits[i].pendx
end

local function arg(i)
  return ARGV[OP + i - 1]
end

local function max(a, b) if a > b then return a end return b end
local function min(a, b) if a < b then return a end return b end

-- Lifetimes (SPEC DQ-5). Every key of a scope expires at one instant of
-- Redis's wall clock, UNTIL (ms), kept in the meta key: the latest
-- `now + TTL` any caller has asked for so far (for a pending hold's keys,
-- its expiry + TTL). Each key written is set to expire then (PXAT,
-- PEXPIREAT), and UNTIL never moves earlier, so no caller shortens a key's
-- life: a key lives as long as the longest window any user of the scope
-- keeps in it. The meta key is rewritten whenever UNTIL moves, so it
-- expires last: when it lapses (a new epoch starts) nothing of the old
-- epoch is left.

-- Redis's wall clock in milliseconds, read once.
local WALL = nil
local function wall_ms()
  if not WALL then
    local t = redis.call("TIME")
    WALL = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return WALL
end

-- The meta key, read once: {epoch, latest instant, until}, or false.
local META = nil
local function meta()
  if META == nil then
    local raw = redis.call("GET", KEYS[1])
    if raw then
      META = cmsgpack.unpack(raw)
      -- Written by an earlier version, which kept no `until`: its TTL.
      if META[3] == nil then META[3] = wall_ms() + max(0, redis.call("PTTL", KEYS[1])) end
    else
      META = false
    end
  end
  return META
end

-- When every key written now expires (ms on Redis's wall clock).
local UNTIL = nil
local function expiry()
  if not UNTIL then
    local m = meta()
    if m then UNTIL = m[3] else UNTIL = wall_ms() + TTL end
  end
  return UNTIL
end

-- Makes every key written from now on live at least `ttl` ms more, and
-- the meta key as long (it must exist: after clock()).
local function live(ttl)
  local wanted = wall_ms() + ttl
  if wanted <= expiry() then return end
  UNTIL = wanted
  META[3] = UNTIL
  redis.call("SET", KEYS[1], cmsgpack.pack(META), "PXAT", UNTIL)
end

-- Writes `value` at `key`, expiring with the scope.
local function write(key, value)
  redis.call("SET", key, value, "PXAT", expiry())
end

-- Makes `key`, if it exists, expire with the scope.
local function refresh(key)
  redis.call("PEXPIREAT", key, expiry())
end

-- The first answer of this named operation, if it already ran: a repeat
-- (a retry after a lost answer, a resend after a dropped connection)
-- returns it and changes nothing (SPEC DQ-6). Every script that changes
-- the scope checks it first.
local function replayed()
  if not MARKER then return nil end
  local raw = redis.call("GET", MARKER)
  if raw then return cmsgpack.unpack(raw) end
  return nil
end

-- Records `answer` as this named operation's first answer; returns it.
local function done(answer)
  if MARKER then redis.call("SET", MARKER, cmsgpack.pack(answer), "PX", MARKER_TTL) end
  return answer
end

-- The current epoch's start (Redis TIME, microseconds), once read.
local EPOCH = nil

-- The store's now: microseconds since the scope's epoch, never earlier
-- than an instant already seen (SPEC Q-13). The epoch is set by the first
-- operation; a scope whose meta key expired starts afresh (its limits'
-- state is meaningless without it).
local function clock()
  local abs
  if ARGV[1] ~= "" then
    abs = tonumber(ARGV[1])
  else
    local t = redis.call("TIME")
    abs = tonumber(t[1]) * 1000000 + tonumber(t[2])
    WALL = math.floor(abs / 1000)
  end
  local m = meta()
  if not m then
    m = { abs, 0, 0 }
    for i = 1, N do
      local l = limits[i]
      redis.call("DEL", l.key, l.log, l.pend, l.pendx)
    end
  end
  EPOCH = m[1]
  local t = max(abs - m[1], m[2])
  UNTIL = max(m[3], wall_ms() + TTL)
  META = { m[1], t, UNTIL, m[4], m[5] }
  redis.call("SET", KEYS[1], cmsgpack.pack(META), "PXAT", UNTIL)
  return t
end

-- The tag a reservation granted in the epoch starting at `epoch` carries
-- (the engine's Reservation.seq): 1 .. 2^32 - 1, never 0.
local function tag_of(epoch)
  return epoch % 4294967295 + 1
end

-- The current epoch's tag (after clock()).
local function tag()
  return tag_of(EPOCH)
end

-- Whether a settlement's tag names the current epoch. A reservation
-- granted before the scope's keys were lost (Redis restarted empty, the
-- keys expired) is not part of any count kept now: settling it must change
-- nothing, or it would give back what was admitted since. Tag 0
-- (untagged) always settles.
local function current(tag_arg)
  if tag_arg == 0 then return true end
  local epoch = EPOCH
  if epoch == nil then
    local m = meta()
    if not m then return false end
    epoch = m[1]
  end
  return tag_of(epoch) == tag_arg
end

---------------------------------------------------------------- sliding --
-- used and carry in the limit's key (cmsgpack {used, carry}); the slot log
-- in a list of its own, oldest first, one element per slot: cmsgpack of
-- opened, closes, expires, amount, pending. The fast path reads and writes
-- the list's two ends only; a settlement locates its slot by binary search
-- (LINDEX), a refusal reads the whole log (LRANGE) to find the earliest
-- instant. Slots are read at most once per script (cache).

local S = {}

function S.load(l, raw)
  local s = { log = l.log, u = 0, c = 0, d = {}, cache = {} }
  if raw then
    local v = cmsgpack.unpack(raw)
    s.u, s.c = v[1], v[2]
    if type(v[3]) == "table" then s.d = v[3] end
  end
  s.n = redis.call("LLEN", l.log)
  return s
end

function S.save(s)
  if #s.d == 0 then return cmsgpack.pack({ s.u, s.c }) end
  return cmsgpack.pack({ s.u, s.c, s.d })
end

function S.touch(l, s)
  if s.n > 0 then refresh(s.log) end
end

-- Slot i (1 = oldest), read once per script.
local function slot(s, i)
  local x = s.cache[i]
  if x then return x end
  local raw = redis.call("LINDEX", s.log, i - 1)
  if not raw then error("tollgate: slot log shorter than its length") end
  local o, c, e, a, p = cmsgpack.unpack(raw)
  x = { o = o, c = c, e = e, a = a, p = p, raw = raw }
  s.cache[i] = x
  return x
end

local function encode(x)
  x.raw = cmsgpack.pack(x.o, x.c, x.e, x.a, x.p)
  return x.raw
end

local function put(s, i, x)
  redis.call("LSET", s.log, i - 1, encode(x))
  s.cache[i] = x
end

local function push(s, x)
  redis.call("RPUSH", s.log, encode(x))
  s.n = s.n + 1
  s.cache[s.n] = x
end

local function pop_front(s)
  redis.call("LPOP", s.log)
  s.n = s.n - 1
  s.cache = {}
end

-- Inserts x before slot i (slots are unique by their opening instant, so
-- the pivot is found by value).
local function insert(s, i, x)
  if i > s.n then return push(s, x) end
  local pivot = slot(s, i).raw
  redis.call("LINSERT", s.log, "BEFORE", pivot, encode(x))
  s.n = s.n + 1
  s.cache = {}
end

function S.advance(l, s, now)
  while s.n > 0 do
    local f = slot(s, 1)
    if f.e > now then break end
    s.u = max(0, s.u - (f.a - f.p))
    s.c = s.c + f.p
    pop_front(s)
  end
end

function S.fits(l, s, amount)
  return amount == 0 or s.u + amount <= l.limit
end

function S.earliest(l, s, amount, now)
  local excess = s.u + amount - l.limit
  if excess <= 0 or amount == 0 then return now end
  local freed = 0
  local all = redis.call("LRANGE", s.log, 0, -1)
  for i = 1, #all do
    local _, _, e, a, p = cmsgpack.unpack(all[i])
    freed = freed + a - p
    if freed >= excess then return max(e, now) end
  end
  return nil
end

function S.add(l, s, amount, now, pending)
  if amount == 0 then return end
  s.u = s.u + amount
  local pend = 0
  if pending then pend = amount end
  local expires = now + l.window
  if s.n > 0 then
    local b = slot(s, s.n)
    if now < b.c then
      b.a = b.a + amount
      b.p = b.p + pend
      b.e = max(b.e, expires)
      put(s, s.n, b)
      return
    end
  end
  push(s, { o = now, c = now + l.res, e = expires, a = amount, p = pend })
end

-- The first index whose slot opened after `at` (n + 1 if none).
local function after(s, at)
  local lo, hi = 1, s.n + 1
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if slot(s, mid).o <= at then lo = mid + 1 else hi = mid end
  end
  return lo
end

-- The slot holding the reservation stamped `stamp`: the one whose span
-- (opened to closes) holds it (every amount joins the slot whose span
-- holds its instant), as the in-process store's `locate`.
local function locate(s, stamp)
  local i
  if s.n > 0 and slot(s, s.n).o <= stamp then
    i = s.n
  else
    i = after(s, stamp) - 1
  end
  if i >= 1 and stamp < slot(s, i).c then return i end
  return nil
end

-- Takes what is carried (pending amounts whose slots aged out).
local function take_carried(s, amount)
  local t = min(amount, s.c)
  s.c = s.c - t
  s.u = max(0, s.u - t)
end

-- Removes a reservation's amount from wherever it is counted, as the
-- in-process store's `take`: a pending amount only from what its slot
-- holds pending, the rest from what is carried; a leased amount only from
-- what its slot holds leased. A settlement whose stamp no longer locates
-- its amount (a recount that landed but whose answers were lost leaves
-- the caller with the lease instant) then never takes another call's
-- pending hold: that would leave the hold's lease less to take than it
-- holds, and its slot more pending than its amount, counted for ever.
local function take(s, stamp, amount, pending)
  local i = locate(s, stamp)
  if not i then
    if pending then take_carried(s, amount) end
    return
  end
  local x = slot(s, i)
  local t
  if pending then t = min(amount, x.p) else t = min(amount, max(0, x.a - x.p)) end
  if t > 0 then
    x.a = x.a - t
    if pending then x.p = x.p - t end
    put(s, i, x)
    s.u = max(0, s.u - t)
  end
  if pending then take_carried(s, amount - t) end
end

function S.refund(l, s, stamp, amount, pending)
  take(s, stamp, amount, pending)
end

function S.lease(l, s, stamp, amount, now)
  take(s, stamp, amount, true)
  S.add(l, s, amount, now, false)
end

function S.release(l, s, stamp, amount)
  take(s, stamp, amount, false)
end

local insert_at

function S.reconcile(l, s, stamp, estimate, actual)
  if estimate == 0 then
    -- A zero amount opened no slot: its debt counts from its own instant.
    insert_at(l, s, actual, stamp, stamp)
    return
  end
  local i = locate(s, stamp)
  if not i then return end
  local x = slot(s, i)
  if actual >= estimate then
    local debt = actual - estimate
    x.a = x.a + debt
    s.u = s.u + debt
  else
    local back = min(estimate - actual, x.a - x.p)
    x.a = x.a - back
    s.u = max(0, s.u - back)
  end
  put(s, i, x)
end

insert_at = function(l, s, amount, at, now)
  local expires = at + l.window
  if amount == 0 or expires <= now then return end
  if s.n == 0 or at >= slot(s, s.n).o then return S.add(l, s, amount, at, false) end
  s.u = s.u + amount
  local nxt = after(s, at)
  local prev = nxt - 1
  if prev >= 1 then
    local x = slot(s, prev)
    if at < x.c then
      x.a = x.a + amount
      x.e = max(x.e, expires)
      put(s, prev, x)
      return
    end
  end
  local closes = at + l.res
  if nxt <= s.n then closes = min(slot(s, nxt).o, closes) end
  insert(s, nxt, { o = at, c = closes, e = expires, a = amount, p = 0 })
end

function S.recount(l, s, stamp, amount, at, now)
  if at <= stamp then return stamp end
  take(s, stamp, amount, false)
  insert_at(l, s, amount, at, now)
  return at
end

function S.available(l, s)
  return l.limit - s.u
end

-- What it counts (pending amounts included), and a fresh state seeded
-- with what another limit counts, as admitted now (see Seeds).
function S.counted(l, s)
  return s.u
end

function S.seed(l, s, amount, now)
  S.add(l, s, amount, now, false)
end

-- Provider feedback (SPEC Q-14, DQ-9). What other clients of the account
-- hold is estimated from each answer's remaining budget and counted in
-- the window until the provider's reset. s.d keeps the estimates in force
-- as a staircase {amount, until, amount, until, ...}: untils ascending,
-- amounts descending, so the amount counted at t is the first entry whose
-- until is after t (the largest estimate still in force). Each step
-- counts in the slot log as a debt of (its amount - the next one's),
-- admitted one window before its until, so it expires then.

-- The steps of staircase d: {amount of the step, its until}.
local function steps(d)
  local out = {}
  for i = 1, #d, 2 do
    local nxt = d[i + 2] or 0
    out[#out + 1] = { d[i] - nxt, d[i + 1] }
  end
  return out
end

-- d with (amount, until) in force too: entries it dominates go (no more
-- and no longer), and it adds nothing where an entry dominates it. At
-- most 16 entries: beyond, the two earliest merge into the larger amount
-- until the later until (counted longer, never less).
local function stair(d, amount, untl)
  local out = {}
  local placed = false
  for i = 1, #d, 2 do
    local a, u = d[i], d[i + 1]
    if a >= amount and u >= untl then return d end
    if not (a <= amount and u <= untl) then
      if not placed and u > untl then
        out[#out + 1] = amount
        out[#out + 1] = untl
        placed = true
      end
      out[#out + 1] = a
      out[#out + 1] = u
    end
  end
  if not placed then
    out[#out + 1] = amount
    out[#out + 1] = untl
  end
  while #out > 32 do
    table.remove(out, 2)
    table.remove(out, 2)
  end
  return out
end

-- The amount the staircase counts at `t`.
local function stair_at(d, t)
  for i = 1, #d, 2 do
    if d[i + 1] > t then return d[i] end
  end
  return 0
end

-- The provider had `remaining` of this limit's budget when it counted the
-- answered attempt (its `amount`), leased at `sent` (plus the round trip
-- the store's instants of responses run late by), counted in the log at
-- `at` (after its recount), by `counted` (its response began). What the
-- provider certainly held of the account's traffic through the store: the
-- attempt itself and every leased amount counted in the log by `sent` and
-- still counted at `counted`; attempts in flight when it was sent are not
-- certain (counting them as the account's would hide others' spending).
-- The rest of what the provider had used is others'. A response recorded
-- later than that round trip can make an attempt that arrived just
-- before this one look uncertain: the estimate is then a little larger,
-- the replicas wait a little longer. It counts
-- until `reset` after `counted` (at most a window), for every process.
-- Returns the units taken and given back (the change in the count).
function S.observe(l, s, remaining, amount, sent, at, counted, reset, now)
  local d = {}
  for i = 1, #s.d, 2 do
    if s.d[i + 1] > now then
      d[#d + 1] = s.d[i]
      d[#d + 1] = s.d[i + 1]
    end
  end
  local before = stair_at(d, now)
  -- The attempt itself, unless its slot is among those read below.
  local own = 0
  local mine = locate(s, at)
  if mine and slot(s, mine).o > sent then own = amount end
  local all = redis.call("LRANGE", s.log, 0, -1)
  for i = 1, #all do
    local o, _, e, a, p = cmsgpack.unpack(all[i])
    if o > sent then break end
    if e > counted then own = own + a - p end
  end
  -- The estimates are in the log too: not the account's own.
  for _, st in ipairs(steps(d)) do
    if st[2] - l.window <= sent and st[2] > counted then own = own - st[1] end
  end
  own = max(own, 0)
  local others = max(0, l.limit - remaining - own)
  if reset <= 0 or reset > l.window then reset = l.window end
  local untl = counted + reset
  local nd = d
  if others > 0 and untl > now then nd = stair(d, others, untl) end
  if nd ~= d then
    for _, st in ipairs(steps(d)) do
      take(s, st[2] - l.window, st[1], false)
    end
    for _, st in ipairs(steps(nd)) do
      insert_at(l, s, st[1], st[2] - l.window, now)
    end
  end
  s.d = nd
  local after = stair_at(nd, now)
  return max(0, after - before), max(0, before - after)
end

----------------------------------------------------------------- bucket --
-- level in units x window ticks, updated (microseconds), pending units.
-- One tick is l.res microseconds (1 unless the limit is so large that a
-- finer tick would leave Lua's exact integers).

local B = {}

-- The level is kept with the tick count of the window (w) and the
-- capacity (c) it was written under, so a reload or a replica with
-- another amount or burst reads the same count (SPEC GW-15, DQ-8):
-- another tick rescales the level (rounded down: counted longer), and
-- what was taken stays taken, so the level moves by the change in
-- capacity (a raised capacity is there at once, a lowered one may leave
-- debt), as the in-process bucket's reconfigure does.
-- level x to / from, rounded down (towards debt: counted longer); exact
-- while the product stays in Lua's exact integers, one unit lower beyond.
local function rescale(level, from, to)
  local x = level * to
  local q = math.floor(x / from)
  if math.abs(x) >= 2 ^ 53 then return q - 1 end
  if q * from > x then q = q - 1 end
  return q
end

function B.load(l, raw)
  if not raw then return { l = l.cap * l.window, u = 0, p = 0 } end
  local b = cmsgpack.unpack(raw)
  local w, c = b.w or l.window, b.c or l.cap
  if w ~= l.window then b.l = rescale(b.l, w, l.window) end
  if c ~= l.cap then b.l = b.l + (l.cap - c) * l.window end
  b.l = min(b.l, l.cap * l.window)
  return b
end

function B.save(b, l)
  b.w, b.c = l.window, l.cap
  return cmsgpack.pack(b)
end

function B.advance(l, b, now)
  if now <= b.u then return end
  local ticks = math.floor((now - b.u) / l.res)
  if ticks == 0 then return end
  b.l = min(b.l + ticks * l.limit, l.cap * l.window)
  b.u = b.u + ticks * l.res
end

local function free(l, b)
  return b.l - b.p * l.window
end

local function need(l, amount)
  return min(amount, l.cap) * l.window
end

function B.fits(l, b, amount)
  return amount == 0 or free(l, b) >= need(l, amount)
end

function B.earliest(l, b, amount, now)
  local n = need(l, amount)
  local deficit = n - free(l, b)
  if deficit <= 0 or amount == 0 then return max(now, b.u) end
  if n + b.p * l.window > l.cap * l.window then return nil end
  local rate = max(l.limit, 1)
  local wait = math.floor((deficit + rate - 1) / rate)
  return max(b.u + wait * l.res, now)
end

local function btake(l, b, amount)
  b.l = b.l - amount * l.window
end

local function bgive(l, b, amount)
  b.l = min(b.l + amount * l.window, l.cap * l.window)
end

function B.add(l, b, amount, now, pending)
  if pending then b.p = b.p + amount else btake(l, b, amount) end
end

function B.refund(l, b, stamp, amount, pending)
  if pending then b.p = max(0, b.p - amount) else bgive(l, b, amount) end
end

function B.lease(l, b, stamp, amount, now)
  b.p = max(0, b.p - amount)
  btake(l, b, amount)
end

function B.release(l, b, stamp, amount)
  bgive(l, b, amount)
end

function B.reconcile(l, b, stamp, estimate, actual)
  if actual >= estimate then btake(l, b, actual - estimate) else bgive(l, b, estimate - actual) end
end

function B.recount(l, b, stamp, amount, at, now)
  return stamp
end

function B.available(l, b)
  return math.floor(free(l, b) / l.window)
end

function B.counted(l, b)
  local missing = max(0, l.cap * l.window - b.l)
  return math.floor((missing + l.window - 1) / l.window) + b.p
end

function B.seed(l, b, amount, now)
  btake(l, b, amount)
end

------------------------------------------------------------------ fixed --
-- index of the current window, used and pending units.

local F = {}

function F.load(l, raw)
  if raw then return cmsgpack.unpack(raw) end
  return { i = 0, u = 0, p = 0 }
end

function F.save(f)
  return cmsgpack.pack(f)
end

local function index_of(l, at)
  return math.floor(at / l.window)
end

function F.advance(l, f, now)
  local idx = index_of(l, now)
  if idx > f.i then
    f.i = idx
    f.u = 0
  end
end

function F.fits(l, f, amount)
  return amount == 0 or f.u + f.p + amount <= l.limit
end

function F.earliest(l, f, amount, now)
  if F.fits(l, f, amount) then return now end
  if f.p + amount > l.limit then return nil end
  return max(l.window * (f.i + 1), now)
end

function F.add(l, f, amount, now, pending)
  if pending then f.p = f.p + amount else f.u = f.u + amount end
end

function F.refund(l, f, stamp, amount, pending)
  if pending then
    f.p = max(0, f.p - amount)
  elseif index_of(l, stamp) == f.i then
    f.u = max(0, f.u - amount)
  end
end

function F.lease(l, f, stamp, amount, now)
  F.advance(l, f, now)
  f.p = max(0, f.p - amount)
  f.u = f.u + amount
end

function F.release(l, f, stamp, amount)
  F.refund(l, f, stamp, amount, false)
end

function F.reconcile(l, f, stamp, estimate, actual)
  if index_of(l, stamp) == f.i then f.u = max(0, f.u - estimate) + actual end
end

-- Counted again in the current window unless it is counted there already
-- (stamped in it); its stamp moves to `at` either way, as in process.
function F.recount(l, f, stamp, amount, at, now)
  local to = index_of(l, at)
  if to ~= f.i then return stamp end
  if to ~= index_of(l, stamp) then f.u = f.u + amount end
  return at
end

function F.available(l, f)
  return l.limit - (f.u + f.p)
end

function F.counted(l, f)
  return f.u + f.p
end

function F.seed(l, f, amount, now)
  f.u = f.u + amount
end

------------------------------------------------------------------ scope --

local ALGO = { s = S, b = B, f = F }

-- Seeds (SPEC GW-15, DQ-8). A reload that changes a limit's window (or
-- algorithm) gives it a key of its own; the caller then passes the limit
-- it replaces too (a transitional limit, kept for one of its windows) and
-- names it as the new limit's source. A source's count is what the new
-- limit starts with, as admitted now (later than it was: counted at least
-- as long as the new window needs it), the first time any process finds
-- the new limit's state missing. A script that reads no clock never
-- writes an unseeded state (see save_one): the next one that does seeds
-- it.
--
-- A new limit whose window is at least as long as its source's, a
-- replaced limit still in force (transitional), then counts, at every
-- script that reads the clock, at least what the source counts (the
-- difference counted as admitted now): everything the source counts lies
-- in the new window too. So what reaches only the source (a settlement
-- through a handle opened before the reload, another process not yet
-- reloaded, a source key left from an earlier change of windows) is not
-- missed by the longer window. A replaced source also floors a shorter
-- new limit, for the new limit's window after the reload (the caller adds
-- 2^20 to its index then): a key left from an earlier configuration
-- missed what was admitted while no configuration had it, and is counted
-- as a missing one would be seeded. A kept source floors the new limit
-- once, at the reloaded handle's first script (a key left from an earlier
-- configuration, as above), then no more: replicas that keep it with
-- other limits beside it count only what they admit (DQ-5).

-- How long limit l's window is, in microseconds.
local function span(l)
  if l.kind == "b" then return l.window * l.res end
  return l.window
end

-- Loads every limit's state (and its algorithm) into l.algo / l.state.
local function load()
  for i = 1, N do
    local l = limits[i]
    l.algo = ALGO[l.kind]
    if not l.algo then error("tollgate: unknown limit kind " .. tostring(l.kind)) end
    local raw = redis.call("GET", l.key)
    l.unseeded = not raw and l.src > 0 and l.src <= N and l.src ~= i
    l.state = l.algo.load(l, raw)
  end
end

local function advance(now)
  for i = 1, N do
    local l = limits[i]
    l.algo.advance(l, l.state, now)
  end
  for i = 1, N do
    local l = limits[i]
    local src = l.src > 0 and l.src ~= i and limits[l.src] or nil
    if src then
      local has = src.algo.counted(src, src.state)
      if l.unseeded then
        l.algo.seed(l, l.state, has, now)
        l.unseeded = false
      elseif l.floor or (src.src == -1 and span(l) >= span(src)) then
        local short = has - l.algo.counted(l, l.state)
        if short > 0 then l.algo.seed(l, l.state, short, now) end
      end
    end
  end
end

-- Writes limit i's state back, expiring with the scope (see
-- REFRESH_HOLDS).
local function save_one(i)
  local l = limits[i]
  if l.unseeded then return end
  write(l.key, l.algo.save(l.state, l))
  if l.algo.touch then l.algo.touch(l, l.state) end
  if REFRESH_HOLDS then
    refresh(l.pend)
    refresh(l.pendx)
  end
end

-- Writes every limit's state back, expiring with the scope.
local function save()
  for i = 1, N do save_one(i) end
end

-- Tells other processes that quota came back (SPEC DQ-4: a waiter there
-- retries before its computed instant).
local function publish()
  redis.call("PUBLISH", CHANNEL, "")
end

--------------------------------------------------------- pending holds --
-- A pending reservation (granted while its call waits for a concurrency
-- permit) is named by an id its caller chose before the round trip, and
-- expires at an instant on the store's clock. So a reserve whose answer was
-- lost can be given back by id (any number of times: only the first finds
-- it), a lease knows whether the hold is still there, and a hold that
-- nobody leases or gives back stops counting at its expiry.

-- Gives back limit l's pending hold `id` if it holds one; true if it did.
local function drop_hold(l, id)
  local raw = redis.call("HGET", l.pend, id)
  redis.call("ZREM", l.pendx, id)
  if not raw then return false end
  redis.call("HDEL", l.pend, id)
  local tick, amount = cmsgpack.unpack(raw)
  l.algo.refund(l, l.state, tick, amount, true)
  return true
end

-- Gives back every pending hold whose expiry has come; true if any.
-- Costs one EXISTS when no limit holds any (the common case).
local function expire_holds(now)
  if N == 0 or redis.call("EXISTS", unpack(pendxs)) == 0 then return false end
  local any = false
  for i = 1, N do
    local l = limits[i]
    local ids = redis.call("ZRANGEBYSCORE", l.pendx, "-inf", now)
    for j = 1, #ids do
      if drop_hold(l, ids[j]) then any = true end
    end
  end
  return any
end

-- Records pending hold `id` on every limit, expiring at `expires`; the
-- scope's keys live a TTL beyond it (see REFRESH_HOLDS).
local function keep_hold(id, now, expires)
  live(TTL + math.ceil((expires - now) / 1000))
  for i = 1, N do
    local l = limits[i]
    redis.call("HSET", l.pend, id, cmsgpack.pack(now, l.amount))
    redis.call("ZADD", l.pendx, expires, id)
    refresh(l.pend)
    refresh(l.pendx)
  end
end

-- Whether every limit still holds pending hold `id`, and what each holds.
local function find_hold(id)
  local found = {}
  for i = 1, N do
    local raw = redis.call("HGET", limits[i].pend, id)
    if not raw then return nil end
    local tick, amount = cmsgpack.unpack(raw)
    found[i] = { tick = tick, amount = amount }
  end
  return found
end

-- Removes pending hold `id` from every limit without giving anything back.
local function forget_hold(id)
  for i = 1, N do
    local l = limits[i]
    redis.call("HDEL", l.pend, id)
    redis.call("ZREM", l.pendx, id)
  end
end
