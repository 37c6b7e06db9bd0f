"""The documented error table is the code's table (docs stay true)."""

from pathlib import Path

from vllm_duplex.domain.errors import ERRORS

DOC = Path(__file__).resolve().parents[2] / "docs" / "errors.md"


def documented_rows() -> dict[str, list[str]]:
    """code -> the cells of its row in docs/errors.md."""
    return {cells[0].strip("`"): cells for line in DOC.read_text().splitlines() if line.startswith("| `")
            for cells in [[c.strip() for c in line.split("|")[1:-1]]]}


def test_every_error_code_is_documented_with_its_retryability():
    rows = documented_rows()
    assert set(rows) == set(ERRORS)
    for code, spec in ERRORS.items():
        assert rows[code][2] == ("yes" if spec.retryable else "no"), code


def test_every_error_code_is_documented_with_its_type_status_and_kind():
    rows = documented_rows()
    for code, spec in ERRORS.items():
        assert rows[code][1] == spec.type, code
        assert rows[code][3] == str(spec.http_status), code
        assert rows[code][4] == f"`{spec.kind.__name__}`", code


def test_every_error_code_is_documented_with_its_grpc_status():
    rows = documented_rows()
    for code, spec in ERRORS.items():
        assert rows[code][5] == f"`{spec.grpc_status}`", code
