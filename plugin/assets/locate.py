"""What a stage's ``model`` / ``voice`` option may name, resolved to files.

Either a pinned name from the catalog (prepared on first use: verified against
its hashes, assembled into the cache), or something of the user's own, used as
it is (no pin to check it against):

- Whisper: a CTranslate2 (faster-whisper) model directory -- ``model.bin``,
  ``config.json``, ``tokenizer.json`` -- such as another faster-whisper size
  converted with ``ct2-transformers-converter``, or a Hugging Face cache entry
  (``~/.cache/huggingface/hub/models--Systran--faster-whisper-small``, or one
  of its ``snapshots/<rev>`` directories).
- Piper: a voice ``.onnx`` file with its ``.onnx.json`` beside it, or a
  directory holding exactly one such pair (a downloaded ``piper-voices`` entry).
"""

from __future__ import annotations

from pathlib import Path

from vllm_duplex.assets.catalog import ASSETS, AssetKind
from vllm_duplex.assets.files import AssetError
from vllm_duplex.assets.prepare import prepare


def _pinned(ref: str, kind: AssetKind) -> Path | None:
    spec = ASSETS.get(ref)
    if spec is None:
        return None
    if spec.kind is not kind:
        raise AssetError(f"model {ref!r} is a {spec.kind.value} model, not a {kind.value} one")
    return prepare(ref)


def hf_snapshot(path: Path) -> Path:
    """A Hugging Face hub cache entry (``models--org--name``) -> the snapshot
    its ``refs/main`` names, or its only snapshot; any other path unchanged."""
    snapshots = path / "snapshots"
    if not snapshots.is_dir():
        return path
    ref = path / "refs" / "main"
    if ref.is_file() and (snapshots / ref.read_text().strip()).is_dir():
        return snapshots / ref.read_text().strip()
    found = sorted(p for p in snapshots.iterdir() if p.is_dir())
    if len(found) != 1:
        raise AssetError(f"{path}: {len(found)} snapshots and no refs/main; "
                         "point at one of its snapshots/<rev> directories")
    return found[0]


def whisper_model_dir(ref: str | Path) -> Path:
    """A faster-whisper model directory for ``ref`` (a pinned name or a path)."""
    if isinstance(ref, str) and (pinned := _pinned(ref, AssetKind.WHISPER)) is not None:
        return pinned
    path = Path(ref).expanduser()
    if not path.is_dir():
        raise AssetError(f"Whisper model {str(ref)!r} is neither a pinned model "
                         f"({', '.join(n for n, a in ASSETS.items() if a.kind is AssetKind.WHISPER)})"
                         " nor a directory")
    path = hf_snapshot(path)
    missing = [f for f in ("model.bin", "config.json", "tokenizer.json") if not (path / f).is_file()]
    if missing:
        # Without tokenizer.json faster-whisper would fetch one from the hub.
        raise AssetError(f"{path} is not a CTranslate2 Whisper model directory: no "
                         f"{', '.join(missing)}")
    return path


def piper_voice_files(ref: str | Path) -> tuple[Path, Path]:
    """``(voice.onnx, voice.onnx.json)`` for ``ref`` (a pinned name or a path)."""
    if isinstance(ref, str) and (pinned := _pinned(ref, AssetKind.PIPER_VOICE)) is not None:
        onnx = next(pinned.glob("*.onnx"))
        return onnx, onnx.with_name(onnx.name + ".json")
    path = Path(ref).expanduser()
    if path.is_dir():
        path = hf_snapshot(path)
        found = sorted(path.glob("*.onnx"))
        if len(found) != 1:
            raise AssetError(f"{path}: expected one Piper voice (.onnx), found {len(found)}")
        path = found[0]
    if not path.is_file() or path.suffix != ".onnx":
        raise AssetError(f"Piper voice {str(ref)!r} is neither a pinned voice "
                         f"({', '.join(n for n, a in ASSETS.items() if a.kind is AssetKind.PIPER_VOICE)})"
                         " nor a .onnx file")
    config = path.with_name(path.name + ".json")
    if not config.is_file():
        raise AssetError(f"{config} is missing (a Piper voice needs its .onnx.json beside it)")
    return path, config
