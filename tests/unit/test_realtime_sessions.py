"""``RealtimeSessions`` (plugin/host/sessions.py), without sockets: the one
admission every route asks (key, model, room, a call's id, in that order),
and the service the ``Runtime`` builds from its parts -- it holds no runtime,
and a restarted worker's lost session is still ``engine_dead`` through it."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
from vllm_duplex.domain.close_reason import CloseReason
from vllm_duplex.domain.commands import SessionResume
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.owner_ids import mint, owner_of
from vllm_duplex.fleet.worker import WorkerRuntime
from vllm_duplex.host.deploy import load_config
from vllm_duplex.host.runtime import Runtime

ROOT = Path(__file__).resolve().parents[2]
KEY = "sk-good"


@pytest.fixture
async def runtime():
    config = load_config("scripted")
    config = dataclasses.replace(config, api_keys=(KEY,), limits=dataclasses.replace(
        config.limits, max_voice_sessions=1))
    runtime = Runtime(config, instance_id="w7")
    await runtime.start()
    yield runtime
    await runtime.stop()


def _refused(call) -> DuplexError:
    with pytest.raises(DuplexError) as refused:
        call()
    return refused.value


async def test_admission_asks_the_key_then_the_model_then_the_room_then_mints(runtime):
    sessions = runtime.sessions
    session = await sessions.open(KEY)  # the one seat
    try:
        assert _refused(lambda: sessions.admit("sk-bad", model="gpt-9")).code == "unauthorized"
        wrong = _refused(lambda: sessions.admit(KEY, model="gpt-9"))
        assert (wrong.code, wrong.param) == ("model_not_found", "model")
        assert all(repr(name) in wrong.message for name in runtime.config.model_names)
        refusals = runtime.metrics.counter("duplex_voice_sessions_refused_total", "").get()
        assert _refused(lambda: sessions.admit(KEY, call="rtc")).code == "at_capacity"
        assert runtime.metrics.counter("duplex_voice_sessions_refused_total", "").get() \
            == refusals + 1
        # A route that leaves the room to ``open`` (or takes no seat) is not refused here.
        call_id = sessions.admit(KEY, model=runtime.config.model, room=False, call="rtc")
        assert call_id is not None and call_id.startswith("rtc_") and owner_of(call_id) == "w7"
        assert sessions.admit(KEY, room=False) is None
    finally:
        await sessions.end(session, CloseReason.CLIENT)
    assert sessions.admit(KEY) is None  # the seat is free again


async def test_a_clean_close_ends_the_session_at_once_a_lost_one_waits(runtime):
    sessions = runtime.sessions
    kept = await sessions.open(KEY)
    await sessions.release(kept, kept.attachment, client_closed=False)
    assert kept.close_reason is None and len(runtime.manager) == 1  # waits for its resume
    await sessions.end(kept, CloseReason.CLIENT)
    ended = await sessions.open(KEY)
    await sessions.release(ended, ended.attachment, client_closed=True)
    assert ended.close_reason is CloseReason.CLIENT and len(runtime.manager) == 0


async def test_a_restarted_workers_lost_session_is_engine_dead():
    runtime = WorkerRuntime(load_config("scripted"), instance_id="w3", life=2)
    await runtime.start()
    try:
        resume = SessionResume(session_id=mint("sess", "w3"), resume_token="t", last_seq=0)
        with pytest.raises(DuplexError) as lost:
            await runtime.sessions.resume(None, resume)
        assert lost.value.code == "engine_dead"
        assert runtime.metrics.resumes.get(outcome="session_not_found") == 1
        other = SessionResume(session_id=mint("sess", "w4"), resume_token="t", last_seq=0)
        with pytest.raises(DuplexError) as not_here:
            await runtime.sessions.resume(None, other)
        assert not_here.value.code == "session_not_found"
    finally:
        await runtime.stop()


def test_the_sessions_service_holds_no_runtime() -> None:
    tree = ast.parse((ROOT / "plugin/host/sessions.py").read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert "vllm_duplex.host.runtime" not in imported
