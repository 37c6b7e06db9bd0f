"""Every repository path the documentation names exists (README.md,
bench/README.md, docs/*.md), so a move that forgets the docs fails here.

Checked: code spans and code blocks, token by token, for paths under the
repository's folders (``plugin/...``, ``tests/...``, ``configs/...`` ...; a
``*`` or ``<name>`` is a wildcard, ``path::test`` names a test in ``path``),
file names without a folder (``supervisor.py``: some source file has it),
module names (``vllm_duplex.fleet.router``, ``...router.RouterPlan``: the
module's file exists and defines the name), and markdown links to files.
Nothing may point outside the repository (``../shared``, ``/work``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "bench" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FOLDERS = ("plugin", "realtime", "models", "tests", "bench", "configs", "scripts", "docs", "proto")
# vllm_duplex.<first part> -> the folder it is installed from (setup.py's package_dir)
PACKAGE_DIRS = {"models": ROOT / "models", "realtime": ROOT / "realtime"}

_FENCE = re.compile(r"^(```|~~~)")
_SPAN = re.compile(r"(`+)(.+?)\1")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_PATH = re.compile(r"(?:\./)?((?:%s)/[\w.*<>/-]*)" % "|".join(FOLDERS))
_MODULE = re.compile(r"\bvllm_duplex(?:\.\w+)+")
_BARE = re.compile(r"[\w-]+\.(?:py|yaml|sh|proto)")  # a file named without its folder


def _sources() -> list[Path]:
    """The repository's own files (no virtualenv, no build output)."""
    out = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("build", "__pycache__")]
        out += [Path(folder, f) for f in files if Path(f).suffix in (".py", ".yaml", ".sh", ".proto")]
    return out


SOURCES = _sources()


def code_text(doc: Path) -> list[tuple[int, str]]:
    """(line number, code) for every code span and every line of a code block."""
    out, fenced = [], False
    for n, line in enumerate(doc.read_text().splitlines(), 1):
        if _FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if fenced:
            out.append((n, line))
        else:
            out += [(n, m.group(2)) for m in _SPAN.finditer(line)]
    return out


def path_exists(path: str) -> bool:
    path = path.split("::")[0].rstrip(".,:;")
    if "/" not in path:
        return any(source.name == path for source in SOURCES)
    if "<" in path or "*" in path:
        pattern = re.sub(r"<[^>]*>", "*", path)
        return any(ROOT.glob(pattern))
    return (ROOT / path).exists()


def module_file(parts: list[str]) -> Path | None:
    """The source file of the module ``vllm_duplex.<parts>``, if there is one."""
    base = PACKAGE_DIRS.get(parts[0]) if parts else None
    folder, rest = (base, parts[1:]) if base else (ROOT / "plugin", parts)
    target = folder.joinpath(*rest)
    for candidate in (target.with_suffix(".py"), target / "__init__.py"):
        if candidate.is_file():
            return candidate
    if not rest or target.is_dir():  # a namespace folder (vllm_duplex itself, or generated stubs)
        return target / "__init__.py" if (target / "__init__.py").is_file() else None
    return None


def module_name_exists(dotted: str) -> bool:
    """``vllm_duplex.a.b[.Name]``: the longest module prefix has a file, and a
    name after it is defined (or imported) at its top level."""
    parts = dotted.split(".")[1:]
    for cut in range(len(parts), -1, -1):
        source = module_file(parts[:cut])
        if source is None:
            continue
        if cut == len(parts):
            return True
        name = parts[cut]
        text = source.read_text()
        return bool(re.search(rf"^(?:async def|def|class) {name}\b|^{name}\s*[:=]|"
                              rf"^(?:from .+ )?import .*\b{name}\b", text, re.M))
    return False


def named_paths() -> list[tuple[str, str]]:
    """(where, path or module) for everything the docs name."""
    found = []
    for doc in DOCS:
        rel = doc.relative_to(ROOT)
        for n, code in code_text(doc):
            for token in code.split():
                token = token.strip("\"'()[],;")
                head = token.split("::")[0].rstrip(".,:;")
                if (m := _PATH.fullmatch(head)) or _BARE.fullmatch(head):
                    found.append((f"{rel}:{n}", m.group(1) if m else head))
                found += [(f"{rel}:{n}", m.group(0)) for m in _MODULE.finditer(token)]
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            for target in _LINK.findall(line):
                if not re.match(r"[a-z]+:|#", target):
                    linked = (doc.parent / target.split("#")[0]).resolve()
                    found.append((f"{rel}:{n}", str(linked.relative_to(ROOT))
                                  if linked.is_relative_to(ROOT) else target))
    return found


def test_the_docs_name_paths_at_all():
    # a parser that finds nothing would pass everything
    paths = {p for _, p in named_paths()}
    assert {"plugin/domain/errors.py", "configs/cascade-cpu.yaml", "docs/clients.md"} <= paths


@pytest.mark.parametrize("where, name", named_paths())
def test_a_named_path_exists(where, name):
    if name.startswith("vllm_duplex."):
        assert module_name_exists(name), f"{where}: {name} names no module or name in the source"
    else:
        assert path_exists(name), f"{where}: {name} does not exist"


def test_nothing_points_outside_the_repository():
    for doc in DOCS:
        text = doc.read_text()
        for outside in ("../shared", "/work/", "DESIGN.md", "CONFORMANCE.md"):
            assert outside not in text, f"{doc.relative_to(ROOT)} points outside: {outside}"
