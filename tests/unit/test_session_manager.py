"""SessionManager: admission, ids, leases, pins, close, key scoping, reaper (VirtualClock)."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.leases.manager import Lease, SessionInfo, SessionManager, SessionState
from vllm_duplex.testing.clock import VirtualClock

KEY = "sk-owner"
OTHER = "sk-other"


class FakeSession:
    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.closed_with: list[str] = []
        self.manager: SessionManager[FakeSession] | None = None

    async def close(self, reason: str) -> None:
        self.closed_with.append(reason)
        if self.manager is not None:  # a session that reports itself while being closed
            await self.manager.release(self.session_id, "self")


def make(clock: VirtualClock | None = None, **kw: object) -> SessionManager[FakeSession]:
    return SessionManager(clock=clock or VirtualClock(), **kw)  # type: ignore[arg-type]


def code_of(exc: pytest.ExceptionInfo[DuplexError]) -> str:
    return exc.value.code


# -- admission and ids ---------------------------------------------------------


async def test_admit_mints_id_and_lease() -> None:
    clock = VirtualClock(100.0)
    mgr = make(clock, default_ttl_s=30.0, instance_id="inst_a")
    s, info = mgr.admit(FakeSession, api_key=KEY)
    assert s.session_id == info.session_id
    assert info.session_id.startswith("sess_") and len(info.session_id) == 5 + 24
    assert info.state is SessionState.ACTIVE
    assert info.lease == Lease(ttl_s=30.0, expires_at=130.0, generation=1)
    assert info.owner_instance_id == "inst_a" and info.created_at == 100.0
    assert info.api_key_id is not None and KEY not in info.api_key_id
    assert len(mgr) == 1 and mgr.stats()["admitted_total"] == 1
    assert make().instance_id.startswith("inst_")


async def test_admission_limit_is_resource_exhausted_and_retryable() -> None:
    mgr = make(max_sessions=2)
    mgr.admit(FakeSession, api_key=KEY)
    mgr.admit(FakeSession, api_key=OTHER)
    with pytest.raises(DuplexError) as exc:
        mgr.admit(FakeSession, api_key=KEY)
    assert code_of(exc) == "resource_exhausted"
    assert exc.value.to_wire()["retryable"] is True
    assert mgr.stats()["rejected_total"] == 1 and len(mgr) == 2


async def test_per_key_limit() -> None:
    mgr = make(max_sessions_per_key=1)
    mgr.admit(FakeSession, api_key=KEY)
    with pytest.raises(DuplexError) as exc:
        mgr.admit(FakeSession, api_key=KEY)
    assert code_of(exc) == "resource_exhausted" and exc.value.to_wire()["retryable"] is True
    mgr.admit(FakeSession, api_key=OTHER)  # other keys are unaffected
    _, info = mgr.admit(FakeSession, api_key=None, session_id="anon")
    await mgr.close(info.session_id, None)
    mgr.admit(FakeSession, api_key=None)  # closing frees the key's slot


@pytest.mark.parametrize("bad", ["", "a" * 129, "has space", "slash/", "ünï", "semi;colon"])
async def test_invalid_session_ids(bad: str) -> None:
    mgr = make()
    with pytest.raises(DuplexError) as exc:
        mgr.admit(FakeSession, api_key=KEY, session_id=bad)
    assert code_of(exc) == "invalid_value" and exc.value.param == "session_id"
    assert len(mgr) == 0


async def test_valid_caller_id_charset() -> None:
    mgr = make()
    sid = "A-z_0.9:x" + "y" * 119
    assert len(sid) == 128
    s, info = mgr.admit(FakeSession, api_key=KEY, session_id=sid)
    assert s.session_id == info.session_id == sid


async def test_duplicate_live_and_tombstoned_ids() -> None:
    mgr = make()
    mgr.admit(FakeSession, api_key=KEY, session_id="dup")
    for key in (KEY, OTHER):
        with pytest.raises(DuplexError) as exc:
            mgr.admit(FakeSession, api_key=key, session_id="dup")
        assert code_of(exc) == "duplicate_id" and "duplicate" in exc.value.message
    await mgr.close("dup", KEY)
    with pytest.raises(DuplexError) as exc:
        mgr.admit(FakeSession, api_key=KEY, session_id="dup")
    assert code_of(exc) == "duplicate_id" and "duplicate" in exc.value.message


@pytest.mark.parametrize("ttl, expected", [(None, 60.0), (0, 60.0), (5.0, 5.0), (10_000.0, 3600.0)])
async def test_ttl_rules(ttl: float | None, expected: float) -> None:
    mgr = make(default_ttl_s=60.0, max_ttl_s=3600.0)
    _, info = mgr.admit(FakeSession, api_key=KEY, ttl_s=ttl)
    assert info.lease.ttl_s == expected


@pytest.mark.parametrize("ttl", [-1.0, float("nan")])
async def test_invalid_ttl(ttl: float) -> None:
    with pytest.raises(DuplexError) as exc:
        make().admit(FakeSession, api_key=KEY, ttl_s=ttl)
    assert code_of(exc) == "invalid_value" and exc.value.param == "ttl_s"


# -- leases ----------------------------------------------------------------------


async def test_lease_expiry_via_reap_once() -> None:
    clock = VirtualClock()
    mgr = make(clock, default_ttl_s=10.0)
    s, info = mgr.admit(FakeSession, api_key=KEY)
    await clock.advance(9.0)
    assert await mgr.reap_once() == 0
    await clock.advance(1.0)
    assert await mgr.reap_once() == 1
    assert s.closed_with == ["expired"]
    assert len(mgr) == 0 and mgr.stats()["expired_total"] == 1
    assert mgr.info(info.session_id, KEY).state is SessionState.EXPIRED
    for op in (lambda: mgr.get(info.session_id, KEY), lambda: mgr.renew(info.session_id, KEY)):
        with pytest.raises(DuplexError) as exc:
            op()
        assert code_of(exc) == "session_expired"


async def test_lapsed_lease_is_expired_before_the_reaper_runs() -> None:
    clock = VirtualClock()
    mgr = make(clock, default_ttl_s=10.0)
    s, info = mgr.admit(FakeSession, api_key=KEY)
    await clock.advance(10.0)
    with pytest.raises(DuplexError) as exc:
        mgr.renew(info.session_id, KEY)  # a late renew cannot resurrect it
    assert code_of(exc) == "session_expired"
    assert mgr.info(info.session_id, KEY).state is SessionState.EXPIRED
    with pytest.raises(DuplexError) as exc:
        await mgr.close(info.session_id, KEY)
    assert code_of(exc) == "session_expired"
    assert s.closed_with == ["expired"] and len(mgr) == 0


async def test_renew_extends_and_bumps_generation() -> None:
    clock = VirtualClock()
    mgr = make(clock, default_ttl_s=10.0)
    _, info = mgr.admit(FakeSession, api_key=KEY)
    await clock.advance(8.0)
    lease = mgr.renew(info.session_id, KEY)
    assert lease == Lease(ttl_s=10.0, expires_at=18.0, generation=2)
    lease = mgr.renew(info.session_id, KEY, ttl_s=20.0, generation=2)
    assert lease == Lease(ttl_s=20.0, expires_at=28.0, generation=3)
    assert mgr.info(info.session_id, KEY).lease == lease
    await clock.advance(19.0)
    assert await mgr.reap_once() == 0
    await clock.advance(1.0)
    assert await mgr.reap_once() == 1


async def test_renew_cas_mismatch_is_lease_conflict() -> None:
    mgr = make()
    _, info = mgr.admit(FakeSession, api_key=KEY)
    mgr.renew(info.session_id, KEY, generation=1)  # -> 2
    with pytest.raises(DuplexError) as exc:
        mgr.renew(info.session_id, KEY, generation=1)  # a second resumer with the old lease
    assert code_of(exc) == "lease_conflict" and exc.value.to_wire()["retryable"] is True
    assert mgr.info(info.session_id, KEY).lease.generation == 2


async def test_pinned_never_expires_and_unpin_starts_ttl() -> None:
    clock = VirtualClock()
    mgr = make(clock, default_ttl_s=10.0)
    _, info = mgr.admit(FakeSession, api_key=KEY, pinned=True)
    await clock.advance(1000.0)
    assert await mgr.reap_once() == 0
    mgr.get(info.session_id, KEY)
    mgr.unpin(info.session_id)
    detached = mgr.info(info.session_id, KEY)
    assert detached.state is SessionState.DETACHED and detached.lease.expires_at == 1010.0
    mgr.pin(info.session_id)  # a resumed socket
    assert mgr.info(info.session_id, KEY).state is SessionState.ACTIVE
    await clock.advance(50.0)
    assert await mgr.reap_once() == 0
    mgr.unpin(info.session_id)
    await clock.advance(9.0)
    assert await mgr.reap_once() == 0
    await clock.advance(1.0)
    assert await mgr.reap_once() == 1


async def test_pins_are_counted() -> None:
    clock = VirtualClock()
    mgr = make(clock, default_ttl_s=1.0)
    _, info = mgr.admit(FakeSession, api_key=KEY, pinned=True)
    mgr.pin(info.session_id)  # a takeover socket attaches before the old one detaches
    mgr.unpin(info.session_id)
    await clock.advance(5.0)
    assert await mgr.reap_once() == 0
    mgr.unpin(info.session_id)
    mgr.unpin(info.session_id)  # unbalanced unpin is harmless
    await clock.advance(1.0)
    assert await mgr.reap_once() == 1


# -- close -----------------------------------------------------------------------


async def test_close_is_idempotent() -> None:
    mgr = make()
    s, info = mgr.admit(FakeSession, api_key=KEY)
    first = await mgr.close(info.session_id, KEY, reason="bye")
    second = await mgr.close(info.session_id, KEY)
    assert first.state is second.state is SessionState.CLOSED
    assert first == second and first.close_reason == "bye"
    assert s.closed_with == ["bye"]  # the session is closed exactly once
    assert mgr.info(info.session_id, KEY).state is SessionState.CLOSED
    with pytest.raises(DuplexError) as exc:
        mgr.get(info.session_id, KEY)
    assert code_of(exc) == "session_closed"
    with pytest.raises(DuplexError) as exc:
        mgr.renew(info.session_id, KEY)
    assert code_of(exc) == "session_closed"
    with pytest.raises(DuplexError) as exc:
        mgr.pin(info.session_id)
    assert code_of(exc) == "session_closed"
    assert mgr.stats()["closed_total"] == 1


async def test_concurrent_closes_close_once() -> None:
    gate = asyncio.Event()

    class Slow(FakeSession):
        async def close(self, reason: str) -> None:
            await gate.wait()
            await super().close(reason)

    mgr: SessionManager[Slow] = SessionManager(clock=VirtualClock())
    s, info = mgr.admit(Slow, api_key=KEY)
    a = asyncio.create_task(mgr.close(info.session_id, KEY))
    b = asyncio.create_task(mgr.close(info.session_id, KEY))
    await asyncio.sleep(0)
    assert mgr.info(info.session_id, KEY).state is SessionState.CLOSING
    with pytest.raises(DuplexError) as exc:
        mgr.get(info.session_id, KEY)
    assert code_of(exc) == "session_closed"
    gate.set()
    ra, rb = await asyncio.gather(a, b)
    assert ra == rb and ra.state is SessionState.CLOSED
    assert s.closed_with == ["client"]


async def test_close_unknown_is_session_not_found() -> None:
    with pytest.raises(DuplexError) as exc:
        await make().close("nope", KEY)
    assert code_of(exc) == "session_not_found"


async def test_close_expired_is_session_expired() -> None:
    clock = VirtualClock()
    mgr = make(clock, default_ttl_s=1.0)
    _, info = mgr.admit(FakeSession, api_key=KEY)
    await clock.advance(2.0)
    await mgr.reap_once()
    with pytest.raises(DuplexError) as exc:
        await mgr.close(info.session_id, KEY)
    assert code_of(exc) == "session_expired"


async def test_release_marks_closed_without_calling_close() -> None:
    mgr = make()
    s, info = mgr.admit(FakeSession, api_key=KEY)
    await mgr.release(info.session_id, "socket_ended")
    await mgr.release(info.session_id, "again")  # idempotent
    await mgr.release("unknown", "x")
    assert s.closed_with == []
    closed = await mgr.close(info.session_id, KEY)
    assert closed.state is SessionState.CLOSED and closed.close_reason == "socket_ended"
    assert len(mgr) == 0 and mgr.stats()["closed_total"] == 1


async def test_release_from_inside_close_does_not_recurse() -> None:
    mgr = make()
    s, info = mgr.admit(FakeSession, api_key=KEY)
    s.manager = mgr
    closed = await mgr.close(info.session_id, KEY, reason="client")
    assert s.closed_with == ["client"] and closed.close_reason == "client"


async def test_failing_session_close_still_buries_it() -> None:
    class Broken(FakeSession):
        async def close(self, reason: str) -> None:
            raise RuntimeError("boom")

    mgr: SessionManager[Broken] = SessionManager(clock=VirtualClock())
    _, info = mgr.admit(Broken, api_key=KEY)
    assert (await mgr.close(info.session_id, KEY)).state is SessionState.CLOSED
    assert len(mgr) == 0


# -- API-key scoping -------------------------------------------------------------


async def test_cross_key_is_not_found_for_live_closed_and_expired() -> None:
    clock = VirtualClock()
    mgr = make(clock, default_ttl_s=5.0)
    _, live = mgr.admit(FakeSession, api_key=KEY, session_id="live", pinned=True)
    _, closed = mgr.admit(FakeSession, api_key=KEY, session_id="closed")
    _, expired = mgr.admit(FakeSession, api_key=KEY, session_id="expired")
    await mgr.close("closed", KEY)
    await clock.advance(10.0)
    await mgr.reap_once()
    assert mgr.info("expired", KEY).state is SessionState.EXPIRED
    for sid in ("live", "closed", "expired", "never-existed"):
        for key in (OTHER, None):
            ops = [
                lambda: mgr.get(sid, key),
                lambda: mgr.info(sid, key),
                lambda: mgr.renew(sid, key),
            ]
            for op in ops:
                with pytest.raises(DuplexError) as exc:
                    op()
                assert code_of(exc) == "session_not_found", (sid, key)
            with pytest.raises(DuplexError) as exc:
                await mgr.close(sid, key)
            assert code_of(exc) == "session_not_found"
    mgr.get("live", KEY)  # still fine for the owner


async def test_keyless_session_is_invisible_to_keyed_callers() -> None:
    mgr = make()
    _, info = mgr.admit(FakeSession, api_key=None)
    mgr.get(info.session_id, None)
    with pytest.raises(DuplexError) as exc:
        mgr.get(info.session_id, KEY)
    assert code_of(exc) == "session_not_found"


# -- tombstones and memory -------------------------------------------------------


async def test_tombstones_are_bounded_lru() -> None:
    mgr = make(tombstones=2)
    for sid in ("a", "b", "c"):
        mgr.admit(FakeSession, api_key=KEY, session_id=sid)
        await mgr.close(sid, KEY)
    with pytest.raises(DuplexError) as exc:
        mgr.info("a", KEY)  # dropped: oldest tombstone
    assert code_of(exc) == "session_not_found"
    assert mgr.info("b", KEY).state is SessionState.CLOSED
    assert mgr.info("c", KEY).state is SessionState.CLOSED


async def test_closed_sessions_are_not_kept_alive() -> None:
    clock = VirtualClock()
    mgr = make(clock, default_ttl_s=1.0)
    s, info = mgr.admit(FakeSession, api_key=KEY)
    ref = weakref.ref(s)
    del s
    await clock.advance(2.0)
    assert await mgr.reap_once() == 1
    gc.collect()
    assert ref() is None
    assert isinstance(mgr.info(info.session_id, KEY), SessionInfo)


# -- reaper task and shutdown ----------------------------------------------------


async def test_reaper_task_expires_session_on_virtual_clock() -> None:
    clock = VirtualClock()
    mgr = make(clock, default_ttl_s=10.0, reap_interval_s=1.0)
    await mgr.start()
    await mgr.start()  # idempotent: still one reaper
    assert [t.get_name() for t in asyncio.all_tasks()].count("duplex-reaper") == 1
    s, info = mgr.admit(FakeSession, api_key=KEY)
    await clock.advance(9.0)
    assert s.closed_with == [] and len(mgr) == 1
    await clock.advance(1.0)
    assert s.closed_with == ["expired"] and len(mgr) == 0
    assert mgr.info(info.session_id, KEY).state is SessionState.EXPIRED
    await mgr.stop()


async def test_stop_closes_everything_and_leaves_no_tasks() -> None:
    clock = VirtualClock()
    mgr = make(clock)
    await mgr.start()
    sessions = [mgr.admit(FakeSession, api_key=KEY, pinned=i % 2 == 0)[0] for i in range(4)]
    await mgr.stop()
    assert all(s.closed_with == ["shutdown"] for s in sessions)
    assert len(mgr) == 0 and mgr.stats()["closed_total"] == 4
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("duplex-")]
    with pytest.raises(DuplexError) as exc:
        mgr.admit(FakeSession, api_key=KEY)  # a stopped manager admits nothing
    assert code_of(exc) == "resource_exhausted"
    await mgr.stop()  # idempotent


async def test_stop_joins_a_close_the_reaper_started() -> None:
    gate = asyncio.Event()

    class Slow(FakeSession):
        async def close(self, reason: str) -> None:
            await gate.wait()
            await super().close(reason)

    clock = VirtualClock()
    mgr: SessionManager[Slow] = SessionManager(clock=clock, default_ttl_s=1.0)
    await mgr.start()
    s, info = mgr.admit(Slow, api_key=KEY)
    await clock.advance(1.0)  # the reaper starts closing and blocks on the gate
    assert mgr.info(info.session_id, KEY).state is SessionState.CLOSING
    stopping = asyncio.create_task(mgr.stop())
    await asyncio.sleep(0)
    gate.set()
    await stopping
    assert s.closed_with == ["expired"]  # not cut short, not closed twice
    assert mgr.info(info.session_id, KEY).state is SessionState.EXPIRED
