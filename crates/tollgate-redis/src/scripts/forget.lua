-- forget: gives back a pending hold by its id, wherever its reserve's
-- answer went (SPEC Q-9). Only the first call finds it: the caller may
-- repeat it when an answer is lost. Arguments: the hold's id. Returns 1
-- if the hold was there, 0 if not.
local again = replayed()
if again then return again end
local id = arg(1)
local now = clock()
load()
advance(now)
local gave = expire_holds(now)
local found = false
for i = 1, N do
  if drop_hold(limits[i], id) then found = true end
end
save()
if gave or found then publish() end
if found then return done(1) end
return done(0)
