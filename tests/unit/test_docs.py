"""The documented error table is the code's table (docs stay true)."""

from pathlib import Path

from vllm_duplex.core.errors import ERRORS

DOC = Path(__file__).resolve().parents[2] / "docs" / "errors.md"


def test_every_error_code_is_documented_with_its_retryability():
    rows = {line.split("|")[1].strip(" `"): line.split("|")[3].strip()
            for line in DOC.read_text().splitlines() if line.startswith("| `")}
    assert set(rows) == set(ERRORS)
    for code, spec in ERRORS.items():
        assert rows[code] == ("yes" if spec.retryable else "no"), code
