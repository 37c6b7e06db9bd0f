"""Stage placement: ``device:`` on a stage spec is parsed at load, handed to the
stage types that can run on a GPU, and refused for those that cannot."""

from __future__ import annotations

import pytest
from vllm_duplex.domain.clock import MonotonicClock
from vllm_duplex.domain.devices import CPU, Device
from vllm_duplex.host.deploy import DeployConfig, StageSpec
from vllm_duplex.host.stage_types import build_stage


def config_with(stage: dict) -> DeployConfig:
    return DeployConfig.from_dict({"name": "t", "model": "m", "policy": "scripted",
                                   "stages": [{"type": "energy_vad"}, stage]})


@pytest.mark.parametrize(("raw", "device"), [("cpu", CPU), ("cuda", Device("cuda", 0)),
                                             ("cuda:1", Device("cuda", 1))])
def test_the_accepted_forms(raw: str, device: Device) -> None:
    assert Device.parse(raw) == device
    assert str(Device.parse(raw)) == ("cpu" if raw == "cpu" else f"cuda:{device.index}")


@pytest.mark.parametrize("raw", ["gpu", "cuda:", "cuda:-1", "cpu:0", "CUDA:1", "", 1, None])
def test_anything_else_is_refused_with_the_accepted_forms(raw: object) -> None:
    with pytest.raises(ValueError, match="'cpu', 'cuda' or 'cuda:N'"):
        Device.parse(raw)


def test_the_config_parses_device_and_names_the_stage_when_it_is_wrong() -> None:
    config = config_with({"type": "whisper", "device": "cuda:1", "beam_size": 1})
    spec = config.stages[1]
    assert spec.device == Device("cuda", 1)
    assert "device" not in spec.options and spec.options == {"beam_size": 1}
    assert config.stages[0].device is None
    with pytest.raises(ValueError, match=r"stages\[1\]\.device: .*'tpu:0'"):
        config_with({"type": "whisper", "device": "tpu:0"})


def test_a_stage_without_a_device_option_is_refused_on_a_gpu_and_fine_on_the_cpu() -> None:
    clock = MonotonicClock()
    with pytest.raises(ValueError, match="'energy_vad' cannot be placed on cuda:0.*runs on the CPU"):
        build_stage(StageSpec("energy_vad", {}, Device("cuda", 0)), clock)
    assert build_stage(StageSpec("energy_vad", {}, CPU), clock).name == "vad"


def test_onnx_stages_get_the_cuda_provider_with_the_cpu_as_fallback() -> None:
    assert CPU.onnx_providers() == ["CPUExecutionProvider"]
    assert Device("cuda", 2).onnx_providers() == [("CUDAExecutionProvider", {"device_id": 2}),
                                                  "CPUExecutionProvider"]


def test_whisper_and_piper_take_the_device_they_are_placed_on() -> None:
    clock = MonotonicClock()
    asr = build_stage(StageSpec("whisper", {"partial_model": None, "warm_up": False}, CPU), clock)
    assert asr.device == CPU and asr.model.device == CPU
    assert asr.model._fw.model.device == "cpu"  # what CTranslate2 itself was given
    tts = build_stage(StageSpec("piper", {"warm_up": False}, CPU), clock)
    try:
        assert tts.device == CPU and tts.voice._session.get_providers() == ["CPUExecutionProvider"]
    finally:
        tts.shutdown_workers()
