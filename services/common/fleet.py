"""The router fleet's Redis side (docs/architecture.md#router-fleet): Lua scripts shared by the
routers (membership, session ownership, admission slots, fenced session writes) and the
readers' view of which router epochs are live (planner snapshot, budget demand).

Liveness is a sorted set, ``keys.ROUTER_ALIVE``: router id -> the deadline of its member lease
in milliseconds of Redis ``TIME``. Every script compares against Redis' own clock, so no
router's clock decides whether another one is dead, and every key a script touches is
declared (all carry the ``{tao}`` hash tag: one Cluster slot). A member lease is renewed every
ttl/3; the holder stops acting ``safety`` before the deadline it last confirmed could pass
(``services.common.core.lease``), so a router is never serving sessions that another router
may already have taken over.
"""

from __future__ import annotations

from collections.abc import Iterable

from services.common.records import SessionRecord, TenantDemandRecord

#: Redis TIME in ms (scripts are replicated by effects since Redis 5, so TIME is allowed)
_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function alive(rid)
  local s = redis.call('ZSCORE', KEYS[ALIVE], rid)
  return s ~= false and s ~= nil and tonumber(s) > now
end
"""


def _script(body: str, alive_index: int) -> str:
    return _NOW.replace("ALIVE", str(alive_index)) + body


#: KEYS = [alive, members, epochs, term, demand (optional)]; ARGV = [rid, ttl_ms, url, process_epoch,
#: last term (0: none)] -> the term. A router still alive under its last term keeps it; otherwise a
#: new term (INCR). Dead members are pruned from the alive set, the members and the epochs on the
#: way, and, with the demand key given, their demand fields (``<tenant>@<rid>``; readers ignore a
#: dead router's records already, this keeps the hash from growing with every router that died).
JOIN = _script("""
local term
if ARGV[5] ~= '0' and alive(ARGV[1]) then term = tonumber(ARGV[5]) else term = redis.call('INCR', KEYS[4]) end
local epoch = string.format('%012d', term) .. '-' .. ARGV[4]
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], cjson.encode({url = ARGV[3], epoch = epoch}))
redis.call('HSET', KEYS[3], ARGV[1], epoch)
local dead = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
local gone = {}
for _, rid in ipairs(dead) do
  redis.call('ZREM', KEYS[1], rid)
  redis.call('HDEL', KEYS[2], rid)
  redis.call('HDEL', KEYS[3], rid)
  gone['@' .. rid] = true
end
if #dead > 0 and #KEYS >= 5 then
  for _, field in ipairs(redis.call('HKEYS', KEYS[5])) do
    local at = string.find(field, '@[^@]*$')
    if at and gone[string.sub(field, at)] then redis.call('HDEL', KEYS[5], field) end
  end
end
return term
""", 1)

#: KEYS = [alive]; ARGV = [rid, ttl_ms] -> 1 renewed, 0 the lease had lapsed (rejoin)
RENEW = _script("""
if not alive(ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
return 1
""", 1)

#: KEYS = [alive, members, epochs]; ARGV = [rid]: leave at once (clean shutdown)
LEAVE = """
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
return 1
"""

#: KEYS = [owners, alive, members, sessions]; ARGV = [session id, rid, settled ('1'/'0'; absent: '1')]
#: -> {-1}: the caller is not alive (it must not serve); {1, rev}: already the caller's;
#:    {0, rev, owner, owner's member JSON}: a live router owns it;
#:    {3, rev, owner}: its owner is dead but the caller is not *settled* (a member for less than
#:    two leases since it last joined): it may not take the session over yet;
#:    {2, rev, SessionRecord JSON or ''}: the caller owns it now (new, or taken from a dead owner),
#:    with the new fencing revision
CLAIM = _script("""
if not alive(ARGV[2]) then return {-1} end
local cur = redis.call('HGET', KEYS[1], ARGV[1])
local rev = 0
if cur then
  local sp = string.find(cur, ' ', 1, true)
  rev = tonumber(string.sub(cur, 1, sp - 1))
  local owner = string.sub(cur, sp + 1)
  if owner == ARGV[2] then return {1, rev} end
  if alive(owner) then return {0, rev, owner, redis.call('HGET', KEYS[3], owner) or ''} end
  if ARGV[3] == '0' then return {3, rev, owner} end
end
rev = rev + 1
redis.call('HSET', KEYS[1], ARGV[1], rev .. ' ' .. ARGV[2])
return {2, rev, redis.call('HGET', KEYS[4], ARGV[1]) or ''}
""", 2)

#: KEYS = [owners, alive, sessions]; ARGV = [rid, limit]
#: -> flat {sid, rev, SessionRecord JSON or '', ...}: up to ``limit`` sessions whose owner is dead,
#: now the caller's under revision + 1 (a dead router's sessions are adopted even if no request
#: for them comes, so they expire or end under a live owner)
ADOPT = _script("""
if not alive(ARGV[1]) then return {} end
local out = {}
local live = {}
local all = redis.call('HGETALL', KEYS[1])
local limit = tonumber(ARGV[2])
for i = 1, #all, 2 do
  local cur = all[i + 1]
  local sp = string.find(cur, ' ', 1, true)
  local owner = string.sub(cur, sp + 1)
  if owner ~= ARGV[1] then
    if live[owner] == nil then live[owner] = alive(owner) end
    if not live[owner] then
      local rev = tonumber(string.sub(cur, 1, sp - 1)) + 1
      redis.call('HSET', KEYS[1], all[i], rev .. ' ' .. ARGV[1])
      out[#out + 1] = all[i]
      out[#out + 1] = rev
      out[#out + 1] = redis.call('HGET', KEYS[3], all[i]) or ''
      if #out >= 3 * limit then break end
    end
  end
end
return out
""", 2)

#: KEYS = [slots of the tenant, alive]; ARGV = [rid, wanted, cap]
#: -> {held now, Σ held by the other live routers, other routers waiting for slots}.
#: Giving back (wanted <= held) always succeeds; more is granted only to a live router and only
#: up to cap - Σ others, so Σ held <= cap whenever it grows. A dead router's slots and its
#: waiting mark are dropped. ``~rid`` marks a router that wanted more than it got.
SLOTS = _script("""
local all = redis.call('HGETALL', KEYS[1])
local others, cur, waiters = 0, 0, 0
for i = 1, #all, 2 do
  local f = all[i]
  if string.sub(f, 1, 1) == '~' then
    local r = string.sub(f, 2)
    if r ~= ARGV[1] then
      if alive(r) then waiters = waiters + 1 else redis.call('HDEL', KEYS[1], f) end
    end
  elseif f == ARGV[1] then
    cur = tonumber(all[i + 1])
  elseif alive(f) then
    others = others + tonumber(all[i + 1])
  else
    redis.call('HDEL', KEYS[1], f)
  end
end
local want = tonumber(ARGV[2])
local n = want
if want > cur then
  if alive(ARGV[1]) then n = math.max(cur, math.min(want, tonumber(ARGV[3]) - others)) else n = cur end
end
if n > 0 then redis.call('HSET', KEYS[1], ARGV[1], n) else redis.call('HDEL', KEYS[1], ARGV[1]) end
if n < want then redis.call('HSET', KEYS[1], '~' .. ARGV[1], 1) else redis.call('HDEL', KEYS[1], '~' .. ARGV[1]) end
redis.call('PEXPIRE', KEYS[1], 600000)
return {n, others, waiters}
""", 2)

#: KEYS = [sessions, owners]; ARGV = [n_set, (sid, owner token, record JSON) x n_set, (sid, owner token)...]
#: Fenced session writes: a record is written (an ended session deleted, with its owner entry)
#: only while the owners hash still holds the writer's token ``"<rev> <rid>"``; '' = a
#: single-turn session nobody else can name (written unconditionally). -> ids refused
FENCED_SESSIONS = """
local refused = {}
local n = tonumber(ARGV[1])
local i = 2
for _ = 1, n do
  local sid, tok, rec = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if tok == '' or redis.call('HGET', KEYS[2], sid) == tok then
    redis.call('HSET', KEYS[1], sid, rec)
  else
    refused[#refused + 1] = sid
  end
  i = i + 3
end
while i <= #ARGV do
  local sid, tok = ARGV[i], ARGV[i + 1]
  if tok == '' then
    redis.call('HDEL', KEYS[1], sid)
  elseif redis.call('HGET', KEYS[2], sid) == tok then
    redis.call('HDEL', KEYS[1], sid)
    redis.call('HDEL', KEYS[2], sid)
  else
    refused[#refused + 1] = sid
  end
  i = i + 2
end
return refused
"""

#: KEYS = [alive, epochs] -> the writer epochs of the live routers (empty: no fleet)
LIVE_EPOCHS = _script("""
local out = {}
local e = redis.call('HGETALL', KEYS[2])
for i = 1, #e, 2 do
  if alive(e[i]) then out[#out + 1] = e[i + 1] end
end
return out
""", 1)


def demand_field(tenant: str, router_id: str) -> str:
    """The field of a fleet router's demand record in ``keys.DEMAND``."""
    return f"{tenant}@{router_id}"


def epoch_counts(epoch: str, fleet: frozenset[str], live: str | bytes | None) -> bool:
    """Whether a record written under ``epoch`` is read: in a router fleet (``fleet``, the live
    routers' epochs) any live router's; else the sole writer's live epoch (any while none is
    known)."""
    return epoch in fleet if fleet else live is None or epoch == live


def merge_demand(records: Iterable[TenantDemandRecord]) -> list[TenantDemandRecord]:
    """One record per tenant: waiting and in-flight summed over the routers that reported it,
    the worst p99s and the freshest report time (epoch and revision of the first one seen)."""
    out: dict[str, TenantDemandRecord] = {}
    for rec in records:
        cur = out.get(rec.tenant)
        if cur is None:
            out[rec.tenant] = rec
            continue
        out[rec.tenant] = cur.model_copy(update={
            "waiting": cur.waiting + rec.waiting, "in_flight": cur.in_flight + rec.in_flight,
            "p99_latency_s": max(cur.p99_latency_s, rec.p99_latency_s),
            "p99_hold_s": max(cur.p99_hold_s, rec.p99_hold_s),
            "updated_at_unix_s": max(cur.updated_at_unix_s, rec.updated_at_unix_s),
        })
    return list(out.values())


def fleet_used(sessions: Iterable[SessionRecord]) -> dict[str, int]:
    """Each replica's admitted tokens over every live router's sessions: their footprints, and
    one copy of each shared prefix they hold there (an admitted session's footprint is then
    without it; docs/algorithms.md#footprint), however many routers' sessions share it."""
    used: dict[str, int] = {}
    copies: dict[tuple[str, str], int] = {}
    for s in sessions:
        if s.admitted and s.replica is not None:
            used[s.replica] = used.get(s.replica, 0) + s.footprint_tokens
            if s.shared_tokens and s.prefix_key:
                key = (s.replica, s.prefix_key)
                copies[key] = max(copies.get(key, 0), s.shared_tokens)
    for (rid, _), tokens in copies.items():
        used[rid] = used.get(rid, 0) + tokens
    return used
