"""An error as an HTTP answer: ``{"error": {...}}`` with the code's status (the
one table, ``domain/errors.py``), and ``Retry-After`` when the error says when
a retry can succeed (a refusal at capacity: ``retry_after_s``)."""

from __future__ import annotations

from starlette.responses import JSONResponse
from vllm_duplex.domain.errors import DuplexError


def error_response(err: DuplexError) -> JSONResponse:
    retry = err.details.get("retry_after_s")
    headers = {"Retry-After": str(int(retry))} if isinstance(retry, (int, float)) else None
    return JSONResponse({"error": err.to_wire()}, status_code=err.spec.http_status, headers=headers)
