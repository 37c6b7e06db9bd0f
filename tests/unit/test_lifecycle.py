"""The host drives stages through typed protocols: ``Lifecycle`` (start, close,
healthy) and ``Metered`` (counters for ``/metrics``); a stage without them is
left alone, and the ``/metrics`` names and labels are those operators scrape."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from vllm_duplex.domain.clock import Clock
from vllm_duplex.host import stage_types
from vllm_duplex.host.deploy import StageSpec, load_config
from vllm_duplex.host.runtime import Runtime
from vllm_duplex.stages.lifecycle import AlwaysReady, Lifecycle, Metered, StageCounter
from vllm_duplex.stages.port import StageBase, StagePort
from vllm_duplex.testing.stages import ScriptedLlmStage


class Engine(Lifecycle, Metered):
    """A stage with an engine: it must be started, closed, and can die."""

    def __init__(self, name: str, calls: list[str]) -> None:
        self.name, self.calls, self.alive, self.restarts = name, calls, True, 0

    async def start(self) -> None:
        self.calls.append(f"start {self.name}")

    async def close(self) -> None:
        self.calls.append(f"close {self.name}")

    @property
    def healthy(self) -> bool:
        return self.alive

    def counters(self) -> dict[StageCounter, float]:
        return {StageCounter.ENGINE_RESTARTS: self.restarts}

    def port(self, session_id: str) -> StagePort:
        raise NotImplementedError


class Bare:
    """A stage that only opens ports: nothing to start, close or count."""

    name = "bare"

    def port(self, session_id: str) -> StagePort:
        raise NotImplementedError


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch) -> tuple[Runtime, list[str], dict[str, Any]]:
    calls: list[str] = []
    built: dict[str, Any] = {}

    def factory(kind: type) -> Any:
        def make(spec: StageSpec, clock: Clock) -> Any:
            name = spec.options["name"]
            built[name] = Engine(name, calls) if kind is Engine else kind()
            return built[name]
        return make

    monkeypatch.setitem(stage_types._REGISTERED, "test_engine", factory(Engine))
    monkeypatch.setitem(stage_types._REGISTERED, "test_bare", factory(Bare))
    config = load_config("scripted")
    config = dataclasses.replace(config, stages=config.stages + (
        StageSpec("test_engine", {"name": "owned"}), StageSpec("test_bare", {"name": "bare"}),
        StageSpec("test_shared", {"name": "shared"})))
    shared = built["shared"] = Engine("shared", calls)
    return Runtime(config, shared_stages={"test_shared": shared}), calls, built


def test_every_built_in_stage_implements_the_protocols_explicitly() -> None:
    assert issubclass(StageBase, AlwaysReady) and issubclass(StageBase, Metered)
    stage = ScriptedLlmStage(clock=None)  # type: ignore[arg-type]
    assert isinstance(stage, Lifecycle) and stage.healthy
    assert stage.counters() == {StageCounter.ABORTED_REQUESTS: 0, StageCounter.ACTIVE_REQUESTS: 0}
    assert not isinstance(Bare(), Lifecycle) and not isinstance(Bare(), Metered)


async def test_start_starts_every_stage_and_stop_closes_only_the_ones_it_built(runtime) -> None:
    rt, calls, _ = runtime
    await rt.start()
    assert calls == ["start owned", "start shared"]
    await rt.stop()
    assert calls == ["start owned", "start shared", "close owned"]  # the shared one is its owner's


def test_health_asks_each_lifecycle_and_assumes_a_bare_stage_can_serve(runtime) -> None:
    rt, _, built = runtime
    assert rt.stage_health() == {"vad": True, "llm": True, "tts": True, "owned": True, "bare": True,
                                 "shared": True}
    built["owned"].alive = False
    assert rt.stage_health()["owned"] is False and not rt.healthy


def test_metrics_show_each_published_counter_per_stage_under_its_fixed_name(runtime) -> None:
    rt, _, built = runtime
    built["owned"].restarts = 3
    built["llm"] = next(s for s in rt.stages if s.name == "llm")
    built["llm"].aborted_requests = 2
    lines = [line for line in rt.metrics.render().splitlines() if "duplex_stage_" in line]
    assert lines == [
        "# HELP duplex_stage_aborted_requests Stage requests (aborted), by stage",
        "# TYPE duplex_stage_aborted_requests gauge",
        'duplex_stage_aborted_requests{stage="llm"} 2',
        'duplex_stage_aborted_requests{stage="tts"} 0',
        'duplex_stage_aborted_requests{stage="vad"} 0',
        "# HELP duplex_stage_active_requests Stage requests (active), by stage",
        "# TYPE duplex_stage_active_requests gauge",
        'duplex_stage_active_requests{stage="llm"} 0',
        'duplex_stage_active_requests{stage="tts"} 0',
        'duplex_stage_active_requests{stage="vad"} 0',
        "# HELP duplex_stage_engine_restarts Engines rebuilt after they died, by stage",
        "# TYPE duplex_stage_engine_restarts gauge",
        'duplex_stage_engine_restarts{stage="owned"} 3',
        'duplex_stage_engine_restarts{stage="shared"} 0',
    ]
