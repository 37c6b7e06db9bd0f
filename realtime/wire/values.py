"""The value parsers every client-event field parser shares: a string, an
integer, a number in a range, a boolean, an object, base64 bytes -- each
raising ``DuplexError`` (``invalid_value`` unless noted) with ``param`` set to
the field's path, and returning ``_MISSING`` for an optional value not given
(``fields.py``: the session's fields; ``items.py``, ``mcp_items.py``:
conversation items; ``codec.py``: the events themselves).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from typing import Any

from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.realtime.wire.aliases import _MISSING


def _bad(param: str, message: str, code: str = "invalid_value") -> DuplexError:
    return DuplexError(code, message, param=param)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _str(v: Any, p: str) -> Any:
    if v is None:
        return _MISSING
    if not isinstance(v, str):
        raise _bad(p, f"{p} must be a string")
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: JSON carries it, no tokenizer takes it
        raise _bad(p, f"{p} is not valid Unicode text") from None
    return v


def _opt_str(v: Any, p: str) -> str | None:
    return None if v is None else _str(v, p)


def _req_str(obj: dict[str, Any], key: str, p: str) -> str:
    v = obj.get(key)
    if v is None:
        raise _bad(p, f"missing required field {p}")
    return _str(v, p)


def _int(v: Any, p: str, lo: int = 0) -> Any:
    if v is None:
        return _MISSING
    if not _is_int(v) or v < lo:
        raise _bad(p, f"{p} must be an integer >= {lo}")
    return v


def _req_int(obj: dict[str, Any], key: str, p: str) -> int:
    v = _int(obj.get(key), p)
    if v is _MISSING:
        raise _bad(p, f"missing required field {p}")
    return v


def _ranged(lo: float, hi: float) -> Callable[[Any, str], Any]:
    def parse(v: Any, p: str) -> Any:
        if v is None:
            return _MISSING
        if not _is_num(v) or not lo <= v <= hi:
            raise _bad(p, f"{p} must be a number in [{lo}, {hi}]")
        return float(v)

    return parse


def _bool(v: Any, p: str) -> Any:
    if v is None:
        return _MISSING
    if not isinstance(v, bool):
        raise _bad(p, f"{p} must be a boolean")
    return v


def _obj(v: Any, p: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise _bad(p, f"{p} must be an object")
    return v


def _b64(v: Any, p: str) -> bytes:
    if not isinstance(v, str):
        raise _bad(p, f"{p} must be a base64 string")
    try:
        return base64.b64decode(v, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise _bad(p, f"{p} is not valid base64", "invalid_audio") from exc
