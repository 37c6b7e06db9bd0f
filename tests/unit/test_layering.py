"""The package's one-way layering (``.importlinter``), checked on every run.

import-linter walks a package's folder, but ``vllm_duplex`` is assembled from
three folders (``plugin/``, ``models/``, ``realtime/``: see setup.py), so the
source is copied into that shape first and checked there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")


def test_import_contracts_hold(tmp_path: Path) -> None:
    pkg = tmp_path / "vllm_duplex"
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "plugin", pkg, ignore=ignore)
    shutil.copytree(ROOT / "models", pkg / "models", ignore=ignore)
    shutil.copytree(ROOT / "realtime", pkg / "realtime", ignore=ignore)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    run = subprocess.run([str(LINT), "--no-cache", str(ROOT / ".importlinter")], cwd=tmp_path,
                         env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "broken" not in run.stdout.lower().replace("0 broken", "")


# The session core calls its parts; a part that took the core could call back
# into it (a trampoline). Only the runner, which drives the core, may name it.
_DRIVERS = {"core.py", "runner.py"}


def test_no_session_part_holds_the_core() -> None:
    import ast

    holders = []
    for path in sorted((ROOT / "plugin" / "session").glob("*.py")):
        if path.name in _DRIVERS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):  # TYPE_CHECKING imports too
            if isinstance(node, ast.ImportFrom) and node.module == "vllm_duplex.session.core":
                holders.append(path.name)
            elif isinstance(node, ast.ImportFrom) and node.module == "vllm_duplex.session" and any(
                    alias.name == "core" for alias in node.names):
                holders.append(path.name)
    assert not holders, (f"{holders} import the session core: a part owns its state, is given "
                         "what it reads, and returns what only the core may do as asks "
                         "(plugin/session/asks.py), which SessionCore.carry carries out")


# The fence moves in one place (plugin/session/fences.py): a move's count and
# its Cancel are said once, and adoption restores through SessionCore.restore
# instead of moving a gate it reached into.
_MOVER = Path("plugin") / "session" / "fences.py"


def test_one_place_moves_the_fence() -> None:
    import ast

    movers = []
    for folder in ("plugin", "models", "realtime"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                        and node.func.attr == "advance" and "gate" in ast.unparse(node.func.value):
                    movers.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert movers and all(m.startswith(f"{_MOVER}:") for m in movers), movers


# Every transport stands on the session port and is handed ``RealtimeSessions``
# (plugin/host/sessions.py), never the Runtime: ``.importlinter``'s transports
# contract keeps the import out; this keeps the object out -- no shell names a
# runtime (and the service holds none: the Runtime builds it from its parts).
_TRANSPORTS = [Path("realtime/server/connection.py"), Path("realtime/server/port"),
               Path("realtime/server/webrtc"), Path("realtime/server/telephony")]


def test_no_transport_reaches_the_runtime() -> None:
    import ast

    reaches = []
    for place in _TRANSPORTS:
        paths = [ROOT / place] if place.suffix else sorted((ROOT / place).rglob("*.py"))
        assert paths and all(p.exists() for p in paths), place
        for path in paths:
            for node in ast.walk(ast.parse(path.read_text())):
                name = (node.id if isinstance(node, ast.Name) else node.attr
                        if isinstance(node, ast.Attribute) else node.arg
                        if isinstance(node, ast.arg) else None)
                if name is not None and name.lstrip("_").lower() == "runtime":
                    reaches.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}")
    assert not reaches, reaches
