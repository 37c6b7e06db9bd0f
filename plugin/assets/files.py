"""Pinned files: find them inside installed packages, check their sha256,
join split ones, and certify a prepared directory with a marker.

A prepared directory holds one entry per ``AssetFile``: a symlink to the
packaged file when it is used as shipped (no copy of 60-75 MB weights), or the
joined file when it ships in parts. Its marker (``.prepared``, written last)
records what was verified: each file's hash, size and modification time. A
later start trusts the marker while every file still has that size and mtime
(a stat, not a re-hash); a reinstalled or touched package changes them, and
the directory is verified again.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from vllm_duplex.assets.catalog import Asset, AssetFile, PackagedFile

MARKER = ".prepared"
_BLOCK = 4 << 20

Progress = Callable[[int], object]  # called with the number of bytes just processed


class AssetError(RuntimeError):
    """A pinned model file is missing or is not the file that was pinned.
    The message names the path and what to reinstall."""


def package_dir(package: str) -> Path:
    """The directory of an installed package, found without importing it (some
    model packages import heavy or missing modules from ``__init__``)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(package)
    return Path(next(iter(spec.submodule_search_locations)))


def source_path(asset: Asset, part: PackagedFile) -> Path:
    try:
        path = package_dir(part.package) / part.path
    except FileNotFoundError:
        raise AssetError(f"model {asset.name!r}: package {part.package!r} is not installed; "
                         f"install it: {asset.reinstall_hint()}") from None
    if not path.is_file():
        raise AssetError(f"model {asset.name!r}: {path} is missing; reinstall: "
                         f"{asset.reinstall_hint()}")
    return path


def sha256_of(path: Path, progress: Progress | None = None) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            digest.update(block)
            if progress is not None:
                progress(len(block))
    return digest.hexdigest()


def verify_part(asset: Asset, part: PackagedFile, progress: Progress | None = None) -> Path:
    """The packaged file, after checking its size and sha256 against the pin."""
    path = source_path(asset, part)
    size = path.stat().st_size
    if size != part.size:
        raise AssetError(f"model {asset.name!r}: {path} has {size} bytes, pinned {part.size} "
                         f"(truncated or replaced); reinstall: {asset.reinstall_hint()}")
    got = sha256_of(path, progress)
    if got != part.sha256:
        raise AssetError(f"model {asset.name!r}: {path} is corrupt (sha256 {got[:16]}..., pinned "
                         f"{part.sha256[:16]}...); reinstall: {asset.reinstall_hint()}")
    return path


def bytes_to_process(asset: Asset) -> int:
    """What a full preparation reads (every part) and writes (joined files)."""
    return sum(p.size for f in asset.files for p in f.parts) + sum(
        f.size for f in asset.files if f.joined)


def _assemble_file(asset: Asset, spec: AssetFile, work: Path, progress: Progress | None) -> None:
    sources = [verify_part(asset, part, progress) for part in spec.parts]
    out = work / spec.name
    if not spec.joined:
        os.symlink(sources[0], out)
        return
    digest = hashlib.sha256()
    with open(out, "wb") as dst:
        for src in sources:
            with open(src, "rb") as f:
                while block := f.read(_BLOCK):
                    dst.write(block)
                    digest.update(block)
                    if progress is not None:
                        progress(len(block))
    if digest.hexdigest() != spec.sha256 or out.stat().st_size != spec.size:
        # Every part matched its pin, so this is a wrong pin or a bad disk.
        raise AssetError(f"model {asset.name!r}: joining {spec.name} gave a file that does not "
                         f"match its pin (disk full or failing?) in {work}")


def _stat_record(path: Path) -> dict[str, int]:
    st = path.stat()  # follows the symlink: the packaged file's own size and mtime
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def assemble(asset: Asset, target: Path, progress: Progress | None = None) -> Path:
    """Verify every part and build ``target`` (replaced if it exists); the
    directory appears complete or not at all (built aside, renamed in)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        record = {}
        for spec in asset.files:
            _assemble_file(asset, spec, work, progress)
            record[spec.name] = {"sha256": spec.sha256, **_stat_record(work / spec.name)}
        (work / MARKER).write_text(json.dumps({"asset": asset.name, "files": record}, indent=1))
        if target.exists():
            shutil.rmtree(target)  # an older or interrupted preparation
        os.replace(work, target)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return target


def certified(asset: Asset, target: Path) -> bool:
    """Does ``target``'s marker vouch for exactly this asset's files, and are
    they still the files it verified (same size and mtime)?"""
    try:
        marker = json.loads((target / MARKER).read_text())
        files = marker["files"]
        if marker.get("asset") != asset.name or set(files) != {f.name for f in asset.files}:
            return False
        for spec in asset.files:
            seen = files[spec.name]
            if seen.get("sha256") != spec.sha256 or seen != {
                    "sha256": spec.sha256, **_stat_record(target / spec.name)}:
                return False
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return True
