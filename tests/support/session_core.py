"""Driving a ``SessionCore`` by value (unit tests): a core with deterministic
ids, its effects read as events or type names, stage outputs and responses
made in one call."""

from __future__ import annotations

from vllm_duplex.domain import commands as cmd
from vllm_duplex.domain import events as ev
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.interruption import Interruption, OutputPacing
from vllm_duplex.domain.metrics import Metrics
from vllm_duplex.domain.payloads import StageOutput
from vllm_duplex.domain.session_config import SessionConfig
from vllm_duplex.models.scripted import ScriptedPolicy
from vllm_duplex.session.core import SessionCore
from vllm_duplex.session.limits import SessionLimits
from vllm_duplex.session.effects import Emit

TEN_MS = bytes(2 * 240)  # 10 ms of PCM16 24 kHz silence
# (the resampler to 16 kHz holds back its first few ms: the first chunks must be longer)


class Ids:
    """Deterministic ids: item_1, resp_2, ..."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}_{self.n}"


def make_core(policy=None, *, stages=("vad", "llm", "tts"), limits: SessionLimits = SessionLimits(),
              asr_languages: frozenset[str] | None = None, **config) -> SessionCore:
    """Unpaced output and immediate interruptions unless a test asks: these
    tests pin the rest of the core (pacing and adaptive interruptions:
    test_output_pacing.py)."""
    config.setdefault("pacing", OutputPacing("none"))
    config.setdefault("interruption", Interruption("immediate"))
    policy = policy or ScriptedPolicy()
    return SessionCore("s", config=SessionConfig(model="m", policy=policy.name, **config),
                       policy=policy, stage_names=stages, metrics=Metrics(), now=0.0,
                       limits=limits, make_id=Ids(), asr_languages=asr_languages)


def manual(**config) -> SessionCore:
    return make_core(turn_detection=None, **config)


def emitted(effects) -> list[ev.ServerEvent]:
    assert all(isinstance(e, Emit) for e in effects), effects
    return [e.envelope.event for e in effects]


def types(effects) -> list[str]:
    return [e.envelope.event.type if isinstance(e, Emit) else type(e).__name__ for e in effects]


def output(core: SessionCore, payload, *, stage: str = "llm", fence: Fence | None = None,
           now: float = 0.0):
    fence = fence or core.fence
    return core.handle(StageOutput(fence, fence.request_id("x"), stage, payload), now)


def create_response(core: SessionCore, now: float = 0.0) -> str:
    effects = core.handle(cmd.ResponseCreate(), now)
    assert types(effects)[-1] == "Submit"
    return core.shown.id
