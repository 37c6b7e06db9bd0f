"""The tiny omni model builders (``vllm_duplex.testing.tiny_omni``): no
network, deterministic, cached behind a fingerprint, and what they write is
what the real checkpoints' loaders read -- the tokenizer's special tokens and
named markup, the processor's config, the weights' names."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from vllm_duplex.testing.tiny_omni import MARKER, build, is_built


def digest(path: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


def test_minicpmo_builds_deterministically_and_once(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_DUPLEX_CACHE", str(tmp_path / "cache"))
    first = build("tiny-minicpmo-4.5")
    assert first == tmp_path / "cache" / "models" / "tiny-minicpmo-4.5" and is_built("tiny-minicpmo-4.5")
    again = build("tiny-minicpmo-4.5", tmp_path / "again")
    assert digest(first) == digest(again)  # same seed, same tokenizer training: same bytes
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert build("tiny-minicpmo-4.5") == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp  # up to date: not rebuilt
    marker = json.loads((first / MARKER).read_text())
    (first / MARKER).write_text(json.dumps({**marker, "fingerprint": "an older builder"}))
    assert not is_built("tiny-minicpmo-4.5")
    build("tiny-minicpmo-4.5")
    assert is_built("tiny-minicpmo-4.5") and digest(first) == digest(again)


def test_minicpmo_tokenizer_and_weights_are_what_vllm_reads(tmp_path):
    from safetensors import safe_open
    from transformers import AutoTokenizer

    path = build("tiny-minicpmo-4.5", tmp_path / "m")
    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
    # vLLM's MiniCPM-o processor finds images, slices and audio by these ids.
    assert tok.convert_ids_to_tokens([tok.im_start_id, tok.slice_start_id, tok.audio_start_id]) == \
        ["<image>", "<slice>", "<|audio_start|>"]
    assert tok.decode(tok.encode("What is the capital of France?", add_special_tokens=False)) == \
        "What is the capital of France?"
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["MiniCPMO"] and config["version"] == 4.5
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        prefixes = {k.split(".")[0] for k in f.keys()}
    assert prefixes == {"llm", "vpm", "resampler", "apm", "audio_projection_layer"}


def test_qwen_omni_is_saved_as_the_real_checkpoint_is(tmp_path):
    from safetensors import safe_open
    from transformers import AutoConfig, AutoTokenizer

    path = build("tiny-qwen2.5-omni", tmp_path / "q")
    config = AutoConfig.from_pretrained(path)
    assert config.architectures == ["Qwen2_5OmniModel"]
    tok = AutoTokenizer.from_pretrained(path)
    thinker = config.thinker_config
    assert tok.convert_tokens_to_ids(["<|AUDIO|>", "<|IMAGE|>"]) == \
        [thinker.audio_token_index, thinker.image_token_index]
    assert tok.audio_bos_token == "<|audio_bos|>" and tok.vision_bos_token == "<|vision_bos|>"
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        assert all(k.startswith("thinker.") for k in f.keys())


def test_unknown_names_are_refused():
    with pytest.raises(KeyError, match="tiny-minicpmo-4.5"):
        build("tiny-gpt")
