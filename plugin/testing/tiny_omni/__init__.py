"""Tiny omni models with random weights, built locally (no network), the way
vLLM's own tests run architectures whose real weights are out of reach:
the real model classes and processors on vLLM, a few layers wide.

    from vllm_duplex.testing.tiny_omni import build
    path = build("tiny-minicpmo-4.5")  # $VLLM_DUPLEX_CACHE/models/tiny-minicpmo-4.5

``scripts/build_tiny_omni.py`` is the command-line form. A build is
deterministic (fixed seeds, a tokenizer trained on fixed sentences) and
cached: the directory's ``.built`` marker records a fingerprint of the
builder's sources and the transformers version, so a second call costs one
file read and a changed builder rebuilds. Each directory is written aside
and renamed in, so a reader never sees a half-built one.

Which of them vLLM 0.32's CPU backend serves, and why not the others, is in
each builder's docstring (``minicpmo``, ``qwen_omni``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from vllm_duplex.assets.prepare import cache_root

MARKER = ".built"
_HERE = Path(__file__).parent


def _builders() -> dict[str, Callable[[Path], None]]:
    from vllm_duplex.testing.tiny_omni import minicpmo, qwen_omni

    return {
        "tiny-minicpmo-4.5": lambda out: minicpmo.build(out, "4.5"),
        "tiny-minicpmo-2.6": lambda out: minicpmo.build(out, "2.6"),
        "tiny-qwen2.5-omni": qwen_omni.build,
    }


NAMES = ("tiny-minicpmo-4.5", "tiny-minicpmo-2.6", "tiny-qwen2.5-omni")


def model_dir(name: str) -> Path:
    return cache_root() / "models" / name


def fingerprint(name: str) -> str:
    """What a build depends on: the builder's sources and transformers."""
    import transformers

    h = hashlib.sha256(f"{name}\0{transformers.__version__}".encode())
    for path in sorted(_HERE.rglob("*.py")):
        h.update(path.relative_to(_HERE).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def is_built(name: str, target: Path | None = None) -> bool:
    marker = (target or model_dir(name)) / MARKER
    try:
        return json.loads(marker.read_text()).get("fingerprint") == fingerprint(name)
    except (OSError, ValueError):
        return False


def build(name: str, target: Path | None = None, *, force: bool = False) -> Path:
    """The directory of the tiny model ``name`` (one of ``NAMES``), built
    first when it is missing, stale or ``force``."""
    builders = _builders()
    if name not in builders:
        raise KeyError(f"unknown tiny model {name!r}; known: {', '.join(NAMES)}")
    target = target or model_dir(name)
    if not force and is_built(name, target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        out = work / "model"
        builders[name](out)
        (out / MARKER).write_text(json.dumps({"name": name, "fingerprint": fingerprint(name)}) + "\n")
        if target.exists():
            shutil.rmtree(target)
        try:
            os.replace(out, target)
        except OSError:
            if not is_built(name, target):  # another process won the race with the same build
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target
