"""External Responses backends a GPT-Live delegation may run on.

A deployment names them (``responses_backends:`` in its config,
``host/backends.py`` reads it); a session's ``delegation.responses.model``
that is one of their names runs its delegated turns there instead of on
this engine's own LLM (``realtime/wire/live/remote.py``, the shell's
``realtime/server/live/backend.py``). The key is a secret: it never appears
in a repr, a log or an error.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ResponsesBackend:
    """``name``: what ``responses.model`` says to pick it; ``base_url``: the
    OpenAI-compatible API root (``http://host:8000/v1``: its ``/responses``
    is called); ``model``: the remote's model name; ``timeout_s``: the most a
    run may take, first byte to last."""

    name: str
    base_url: str
    model: str
    timeout_s: float = 60.0
    api_key: str | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + "/responses"
