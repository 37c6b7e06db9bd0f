"""``responses_backends:`` of a deployment config: the external Responses
endpoints GPT-Live delegations may name (``domain/backends.py``).

    responses_backends:
      remote:                              # delegation.responses.model: remote
        base_url: http://10.0.0.7:8000/v1  # any OpenAI-compatible API (vllm serve's)
        model: smollm2                     # the remote's model name (default: the name)
        api_key_env: REMOTE_API_KEY        # or api_key_file: /run/secrets/remote
        timeout_s: 30                      # a whole run (default 60)

A key is read from the environment or a file, never written in the config:
configs are committed, keys are not. Unknown keys, a bad URL or a key named
but absent fail the start, as every config error does.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from vllm_duplex.domain.backends import ResponsesBackend

_KEYS = {"base_url", "model", "api_key_env", "api_key_file", "timeout_s"}


def backends_from_raw(raw: Any) -> dict[str, ResponsesBackend]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ValueError("responses_backends maps names to {base_url, ...}")
    return {name: _one(name, spec) for name, spec in raw.items()}


def _one(name: Any, spec: Any) -> ResponsesBackend:
    where = f"responses_backends.{name}"
    if not isinstance(name, str) or not name:
        raise ValueError("responses_backends: each name is a non-empty string")
    if not isinstance(spec, dict):
        raise ValueError(f"{where} must be a mapping")
    bad = set(spec) - _KEYS
    if bad:
        raise ValueError(f"unknown {where} keys: {sorted(bad)}")
    url = spec.get("base_url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ValueError(f"{where}.base_url is the http(s):// API root, e.g. http://host:8000/v1")
    model = spec.get("model", name)
    if not isinstance(model, str) or not model:
        raise ValueError(f"{where}.model must be a non-empty string")
    timeout = spec.get("timeout_s", 60.0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError(f"{where}.timeout_s must be a number of seconds > 0")
    return ResponsesBackend(name=name, base_url=url, model=model, timeout_s=float(timeout),
                            api_key=_key(where, spec))


def _key(where: str, spec: dict[str, Any]) -> str | None:
    env, path = spec.get("api_key_env"), spec.get("api_key_file")
    if env is not None and path is not None:
        raise ValueError(f"{where}: api_key_env or api_key_file, not both")
    if env is not None:
        key = os.environ.get(str(env))
        if not key:
            raise ValueError(f"{where}.api_key_env: ${env} is not set")
        return key
    if path is not None:
        try:
            key = Path(str(path)).read_text().strip()
        except OSError as e:
            raise ValueError(f"{where}.api_key_file: cannot read it ({e.strerror})") from None
        if not key:
            raise ValueError(f"{where}.api_key_file is empty")
        return key
    return None
