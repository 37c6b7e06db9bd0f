"""The stage types a deployment config can name (``stages: [{type: ...}]``).

Types are entry points of the group ``vllm_duplex.stages`` (setup.py lists the
built-in ones; a third-party package adds its own the same way), so the
registry names a class without importing it: a class is imported only when a
config uses its type, and a scripted deployment never imports vLLM or torch.
The scripted stages of ``vllm_duplex.testing`` are registered this way too,
which keeps product code from ever importing the testing package.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from importlib.metadata import entry_points

from vllm_duplex.domain.clock import Clock
from vllm_duplex.host.deploy import StageSpec
from vllm_duplex.stages.port import Stage

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "vllm_duplex.stages"

StageFactory = Callable[[StageSpec, Clock], Stage]

_REGISTERED: dict[str, StageFactory] = {}  # by hand (tests, embedding): wins over entry points


def register_stage_type(name: str, factory: StageFactory) -> None:
    _REGISTERED[name] = factory


def stage_types() -> list[str]:
    return sorted({*_REGISTERED, *(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))})


def build_stage(spec: StageSpec, clock: Clock) -> Stage:
    factory = _REGISTERED.get(spec.type)
    if factory is not None:
        return factory(spec, clock)
    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == spec.type]
    if not found:
        raise ValueError(f"unknown stage type {spec.type!r}; known: {stage_types()}")
    cls = found[0].load()
    options = dict(spec.options)
    if spec.device is not None:
        if "device" in inspect.signature(cls).parameters:
            options["device"] = spec.device
        elif spec.device.is_gpu:
            raise ValueError(
                f"stage type {spec.type!r} cannot be placed on {spec.device}: it has no device "
                "option and runs on the CPU (a vLLM engine is placed by its process's "
                "CUDA_VISIBLE_DEVICES and engine_kwargs; docs/deploy.md)")
    return cls(clock=clock, **options)
