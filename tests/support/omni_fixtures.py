"""The tiny MiniCPM-o 4.5 on the real vLLM engine, for the native omni path
(``tiny_omni_stage`` in tests/conftest.py: one engine per test session).

What the model's processor makes of a unit, computed here from MiniCPM-o's
rules (not read back from the stage): audio is 100 feature frames a second,
halved by the encoder's convolution and pooled ``POOL_STEP`` to a token, in
chunks of one second, each chunk between ``<|audio_start|>`` and
``<|audio_end|>``; an image small enough not to be sliced is its index
(``<image_id>0</image_id>``) and ``QUERIES`` tokens between ``<image>`` and
``</image>``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math

from vllm_duplex.host.deploy import DeployConfig, load_config
from vllm_duplex.testing.tiny_omni import build
from vllm_duplex.testing.tiny_omni.minicpmo import POOL_STEP, QUERIES

MODEL = "tiny-minicpmo-4.5"
CONFIG = "omni-tiny-cpu"


def audio_tokens(samples: int, pool: int = POOL_STEP["4.5"]) -> int:
    """Tokens of one audio item of ``samples`` (16 kHz), markup included."""
    frames = math.ceil(samples / 160)
    out = ((frames - 1) // 2 + 1 - pool) // pool + 1
    per_chunk = ((100 - 1) // 2 + 1 - pool) // pool + 1
    return out + 2 * math.ceil(out / per_chunk)


def image_tokens() -> int:
    """Tokens of one image that is not sliced (at most 448 x 448 pixels)."""
    return QUERIES + 5  # <image_id> 0 </image_id> <image> ... </image>


def config(model_dir: str | None = None) -> DeployConfig:
    """configs/omni-tiny-cpu.yaml, its model at ``model_dir`` (the built one),
    sessions ending with their socket."""
    cfg = load_config(CONFIG)
    stages = tuple(dataclasses.replace(s, options={**s.options, "model": model_dir})
                   if s.type == "vllm_omni" and model_dir else s for s in cfg.stages)
    return dataclasses.replace(cfg, stages=stages,
                               limits=dataclasses.replace(cfg.limits, resume_grace_s=0))


def omni_options(cfg: DeployConfig) -> dict:
    return dict(next(s for s in cfg.stages if s.type == "vllm_omni").options)


async def tiny_omni_stage():
    from vllm_duplex.stages.omni.vllm_omni import VllmOmniStage

    path = await asyncio.to_thread(build, MODEL)
    stage = VllmOmniStage(**omni_options(config(str(path))))
    await stage.start()
    return stage
