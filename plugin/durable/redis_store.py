"""The Redis session store (the ``redis`` package's asyncio client).

Keys of session ``S`` (all expire ``Bounds.keep_s`` after the last write):

* ``duplex:{S}:gen``   the generation (INCR on every acquire)
* ``duplex:{S}:lease`` ``"<holder> <generation>"`` with a PX expiry: the lease
* ``duplex:{S}:state`` the encoded ``SessionState``
* ``duplex:{S}:log``   a Stream: entry id ``<seq>-0``, fields ``n`` (size),
  ``t`` (unix ms), ``e`` (the encoded envelope)
* ``duplex:{S}:meta``  a hash: ``bytes`` retained in the log
* ``duplex:dead:<holder>``  set by a supervisor that saw the holder's process die

Every write is a Lua script that first compares the generation (the fence):
a write of a stale owner is refused inside Redis, atomically with the write.
The append script trims the stream to the bounds (events, bytes, age; the
newest stays), as the in-memory journal does; the trim script drops what the
client acknowledged. A batch is one pipeline (one
round trip, not a transaction: each script is atomic on its own, and the
order of a session's writes is kept).
"""

from __future__ import annotations

import time
from typing import Any

from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.durable.store import (
    Append,
    Bounds,
    Drop,
    Fenced,
    LeaseHeld,
    Lost,
    Save,
    SessionStore,
    Stored,
    StoreUnavailable,
    Trim,
    Write,
    decode,
    encode,
)

_ACQUIRE = """
local cur = redis.call('GET', KEYS[1])
if cur then
  local holder, gen = string.match(cur, '^(%S+) (%d+)$')
  if holder ~= ARGV[1] and redis.call('EXISTS', ARGV[3] .. holder) == 0 then
    return {0, cur}
  end
end
if ARGV[4] == 'new' then
  if redis.call('EXISTS', KEYS[2]) == 1 then return {-2, ''} end
elseif redis.call('EXISTS', KEYS[3]) == 0 then
  return {-1, ''}
end
local g = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. g, 'PX', ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[5])
return {g, ''}
"""

_RENEW = """
local g = redis.call('GET', KEYS[2])
if not g then return -3 end
if g ~= ARGV[2] then return -1 end
redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. ARGV[2], 'PX', ARGV[3])
for i = 2, #KEYS do redis.call('PEXPIRE', KEYS[i], ARGV[4]) end
return 1
"""

# KEYS: gen, log, meta, state, lease. ARGV: gen, max_events, max_bytes,
# cutoff_ms, keep_ms, then (seq, size, t_ms, payload) per event.
_APPEND = """
local g = redis.call('GET', KEYS[1])
if not g then return -3 end
if g ~= ARGV[1] then return -1 end
local head = tonumber(redis.call('HGET', KEYS[3], 'head') or '0')
for i = 6, #ARGV, 4 do
  local seq = tonumber(ARGV[i])
  if seq > head then
    if seq ~= head + 1 then
      redis.call('DEL', KEYS[2]); redis.call('HSET', KEYS[3], 'bytes', 0)
    end
    redis.call('XADD', KEYS[2], ARGV[i] .. '-0', 'n', ARGV[i+1], 't', ARGV[i+2], 'e', ARGV[i+3])
    redis.call('HINCRBY', KEYS[3], 'bytes', ARGV[i+1])
    head = seq
  end
end
redis.call('HSET', KEYS[3], 'head', head)
local max_events, max_bytes, cutoff = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
while true do
  local n = redis.call('XLEN', KEYS[2])
  if n <= 1 then break end
  local first = redis.call('XRANGE', KEYS[2], '-', '+', 'COUNT', 1)[1]
  local size, t = tonumber(first[2][2]), tonumber(first[2][4])
  local bytes = tonumber(redis.call('HGET', KEYS[3], 'bytes'))
  if n > max_events or bytes > max_bytes or t < cutoff then
    redis.call('XDEL', KEYS[2], first[1])
    redis.call('HINCRBY', KEYS[3], 'bytes', -size)
  else
    break
  end
end
for i = 1, 4 do redis.call('PEXPIRE', KEYS[i], ARGV[5]) end
return head
"""

# KEYS: gen, state, meta, lease. ARGV: gen, state, keep_ms, holder ('' : none), ttl_ms
_SAVE = """
local g = redis.call('GET', KEYS[1])
if not g then
  if ARGV[4] == '' then return -3 end
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
  redis.call('SET', KEYS[4], ARGV[4] .. ' ' .. ARGV[1], 'PX', ARGV[5])
elseif g ~= ARGV[1] then
  return -1
end
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return tonumber(redis.call('HGET', KEYS[3], 'head') or '0')
"""

# KEYS: gen, lease, state, log, meta. ARGV: gen, release_only, forget
# A dropped session keeps its generation until it expires with the rest
# (keep_s): an older owner that wakes up is fenced by it, never told the
# store lost the session (it would write its stale copy back).
_DROP = """
local g = redis.call('GET', KEYS[1])
if not g then return -3 end
if g ~= ARGV[1] then return -1 end
local head = tonumber(redis.call('HGET', KEYS[5], 'head') or '0')
if ARGV[2] == '1' then
  redis.call('DEL', KEYS[2])
elseif ARGV[3] == '1' then
  redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5])
else
  redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5])
end
return head
"""


# KEYS: gen, log, meta. ARGV: gen, seq (the client acked every event up to
# it), seq + 1. The acked entries go (XTRIM MINID: ids below seq + 1), their
# bytes with them; the head stays.
_TRIM = """
local g = redis.call('GET', KEYS[1])
if not g then return -3 end
if g ~= ARGV[1] then return -1 end
local gone = redis.call('XRANGE', KEYS[2], '-', ARGV[2] .. '-0')
if #gone > 0 then
  local bytes = 0
  for _, e in ipairs(gone) do bytes = bytes + tonumber(e[2][2]) end
  redis.call('XTRIM', KEYS[2], 'MINID', ARGV[3] .. '-0')
  redis.call('HINCRBY', KEYS[3], 'bytes', -bytes)
end
return tonumber(redis.call('HGET', KEYS[3], 'head') or '0')
"""


def _keys(session_id: str) -> dict[str, str]:
    p = f"duplex:{{{session_id}}}:"  # one hash slot per session (Redis Cluster)
    return {k: p + k for k in ("gen", "lease", "state", "log", "meta")}


DEAD_PREFIX = "duplex:dead:"


def _failure(session_id: str, code: int) -> Fenced | Lost:
    return Lost(session_id) if code == -3 else Fenced(session_id)


class RedisStore(SessionStore):
    durable = True

    def __init__(self, url: str, bounds: Bounds = Bounds(), *, timeout_s: float = 2.0) -> None:
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        self.url = url
        self.bounds = bounds
        # No retries inside the client: an unreachable store must show within
        # ``timeout_s`` (the writer degrades, retries on its own, and the
        # sessions' events stop waiting for it), not after a backoff series.
        self._redis = aioredis.Redis.from_url(url, socket_timeout=timeout_s,
                                              socket_connect_timeout=timeout_s,
                                              retry=Retry(NoBackoff(), 0))
        self._acquire = self._redis.register_script(_ACQUIRE)
        self._renew = self._redis.register_script(_RENEW)
        self._append = self._redis.register_script(_APPEND)
        self._save = self._redis.register_script(_SAVE)
        self._drop = self._redis.register_script(_DROP)
        self._trim = self._redis.register_script(_TRIM)

    @property
    def _keep_ms(self) -> int:
        return int(self.bounds.keep_s * 1000)

    async def _call(self, coro: Any) -> Any:
        import redis.exceptions as rexc

        try:
            return await coro
        except (rexc.ConnectionError, rexc.TimeoutError, OSError) as err:
            raise StoreUnavailable(str(err)) from err

    async def acquire(self, session_id: str, holder: str, ttl_s: float, *,
                      new: bool = False) -> int:
        k = _keys(session_id)
        code, cur = await self._call(self._acquire(
            keys=[k["lease"], k["gen"], k["state"]],
            args=[holder, int(ttl_s * 1000), DEAD_PREFIX, "new" if new else "adopt",
                  self._keep_ms]))
        if code == 0:
            held, _, gen = cur.decode().partition(" ")
            raise LeaseHeld(held, int(gen))
        if code == -1:
            raise DuplexError("session_not_found", f"no session {session_id!r}",
                              param="session_id")
        if code == -2:
            raise DuplexError("duplicate_id", f"session {session_id!r} exists", param="session_id")
        return int(code)

    async def renew(self, leases: dict[str, tuple[str, int]], ttl_s: float
                    ) -> dict[str, Fenced | Lost]:
        if not leases:
            return {}
        pipe = self._redis.pipeline(transaction=False)
        ids = list(leases)
        for session_id in ids:
            k = _keys(session_id)
            holder, gen = leases[session_id]
            await self._renew(keys=[k["lease"], k["gen"], k["state"], k["log"], k["meta"]],
                              args=[holder, gen, int(ttl_s * 1000), self._keep_ms], client=pipe)
        results = await self._call(pipe.execute())
        return {sid: _failure(sid, int(code)) for sid, code in zip(ids, results) if int(code) < 0}

    async def apply(self, writes: list[Write]) -> dict[str, int | Fenced | Lost]:
        if not writes:
            return {}
        pipe = self._redis.pipeline(transaction=False)
        order: list[str] = []
        now_ms = int(time.time() * 1000)
        cutoff = now_ms - int(self.bounds.max_age_s * 1000)
        i = 0
        while i < len(writes):  # consecutive appends of a session: one script call
            w = writes[i]
            k = _keys(w.session_id)
            if isinstance(w, Append):
                args: list[Any] = [w.generation, self.bounds.max_events, self.bounds.max_bytes,
                                   cutoff, self._keep_ms]
                while (i < len(writes) and isinstance(writes[i], Append)
                       and writes[i].session_id == w.session_id
                       and writes[i].generation == w.generation):
                    a = writes[i]
                    args += [a.seq, a.size, int(a.at * 1000), encode(a.payload)]
                    i += 1
                await self._append(keys=[k["gen"], k["log"], k["meta"], k["state"]], args=args,
                                   client=pipe)
            elif isinstance(w, Save):
                await self._save(keys=[k["gen"], k["state"], k["meta"], k["lease"]],
                                 args=[w.generation, encode(w.state), self._keep_ms,
                                       w.holder or "", int(w.ttl_s * 1000)], client=pipe)
                i += 1
            elif isinstance(w, Trim):
                await self._trim(keys=[k["gen"], k["log"], k["meta"]],
                                 args=[w.generation, w.seq, w.seq + 1], client=pipe)
                i += 1
            else:
                assert isinstance(w, Drop)
                await self._drop(keys=[k["gen"], k["lease"], k["state"], k["log"], k["meta"]],
                                 args=[w.generation, "1" if w.release_only else "0",
                                       "1" if w.forget else "0"], client=pipe)
                i += 1
            order.append(w.session_id)
        results = await self._call(pipe.execute())
        out: dict[str, int | Fenced | Lost] = {}
        for session_id, head in zip(order, results):
            if isinstance(out.get(session_id), (Fenced, Lost)):
                continue
            out[session_id] = _failure(session_id, int(head)) if int(head) < 0 else int(head)
        return out

    async def load(self, session_id: str) -> Stored | None:
        k = _keys(session_id)
        pipe = self._redis.pipeline(transaction=False)
        pipe.get(k["state"]).get(k["gen"]).get(k["lease"]).hget(k["meta"], "head")
        pipe.xrange(k["log"], "-", "+", count=1)
        state, gen, lease, head, first = await self._call(pipe.execute())
        if state is None or gen is None:
            return None
        holder = None
        if lease is not None:
            held = lease.decode().split(" ")[0]
            if not await self._call(self._redis.exists(DEAD_PREFIX + held)):
                holder = held
        head_seq = int(head or 0)
        first_seq = int(first[0][0].decode().split("-")[0]) if first else head_seq + 1
        return Stored(session_id, decode(state), int(gen), holder, first_seq, head_seq)

    async def events_after(self, session_id: str, seq: int) -> list[Any] | None:
        k = _keys(session_id)
        cutoff = int(time.time() * 1000) - int(self.bounds.max_age_s * 1000)
        entries = await self._call(self._redis.xrange(k["log"], f"{seq + 1}-0", "+"))
        head = int(await self._call(self._redis.hget(k["meta"], "head")) or 0)
        if seq >= head:
            return []
        events = []
        for i, (entry_id, fields) in enumerate(entries):
            is_newest = i == len(entries) - 1
            if int(fields[b"t"]) < cutoff and not is_newest:
                return None  # older than retention: the age bound, as the in-memory journal
            events.append((int(entry_id.decode().split("-")[0]), fields[b"e"]))
        if not events or events[0][0] != seq + 1:
            return None
        return [decode(e) for _, e in events]

    async def mark_dead(self, holder: str) -> None:
        await self._call(self._redis.set(DEAD_PREFIX + holder, 1, ex=86400))

    async def ping(self) -> bool:
        try:
            return bool(await self._call(self._redis.ping()))
        except StoreUnavailable:
            return False

    async def memory_usage(self, session_id: str) -> int:
        """Bytes Redis holds for the session (``MEMORY USAGE`` of its keys)."""
        total = 0
        for key in _keys(session_id).values():
            total += int(await self._call(self._redis.memory_usage(key, samples=0)) or 0)
        return total

    async def close(self) -> None:
        await self._redis.aclose()
