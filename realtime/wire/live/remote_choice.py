"""A Decisions question (``ChoiceAsk``) asked of an external Responses
backend: what to ask and what its answer means. Sans-I/O; the shell
(``realtime/server/live/backend.py``, ``RemoteChooser``) makes the call.

The request is the ask's messages as input, greedy, the answer held to the
options by the Responses API's structured output (``text.format``: a JSON
schema whose value is a string, one of the options), with the answer's
token logprobs (``include: ["message.output_text.logprobs"]``,
``top_logprobs``). The answer is a JSON string: the option it names is the
choice. Each option's probability comes from the top logprobs at the first
token that leaves the opening quote: one token per option, as this engine's
own chooser counts each option's first token (``plugin/text/decisions.py``)
-- for the chosen option the token it was written with, for another the
longest alternative its quoted text begins with (how a tokenizer writes it;
the API gives token texts, not ids). vLLM reports these after the schema's
mask: every alternative is a way to begin an option, and a shorter one
("L" for "London") is a path greedy decoding did not take. Options that
share a token split it, all of it to the chosen when it is among them;
normalised to 1. Greedy decoding writes the likeliest token, so the choice
is the likeliest option. A backend that returns no logprobs gives its
choice probability 1: the answer is all it said.
"""

from __future__ import annotations

import json
from typing import Any

from vllm_duplex.domain.decisions import ChoiceAsk, Chosen, spread
from vllm_duplex.domain.errors import DuplexError

TOP_LOGPROBS = 20  # vLLM's default max_logprobs: the most a server is sure to allow
_ROLES = {"system": "system", "developer": "developer", "user": "user", "assistant": "assistant"}


def choice_request(model: str, ask: ChoiceAsk) -> dict[str, Any]:
    """The ``POST /responses`` body that asks ``ask`` of ``model``."""
    longest = max(len(json.dumps(o)) for o in ask.options)
    return {
        "model": model,
        "input": [{"type": "message", "role": _ROLES.get(m.role, "user"), "content": m.text}
                  for m in ask.messages],
        "text": {"format": {"type": "json_schema", "name": "choice", "strict": True,
                            "schema": {"type": "string", "enum": list(ask.options)}}},
        "temperature": 0.0,
        # every character of the longest option a token, and the end: always room
        "max_output_tokens": longest + 1,
        "top_logprobs": TOP_LOGPROBS,
        "include": ["message.output_text.logprobs"],
        "store": False,
    }


def read_choice(body: Any, options: tuple[str, ...], backend: str) -> Chosen:
    """The backend's answer to one ask; ``backend_error`` naming ``backend``
    when it is not a completed Responses object naming one of ``options``."""
    def bad(what: str) -> DuplexError:
        return DuplexError("backend_error", f"the Responses backend {backend!r} {what}")

    if not isinstance(body, dict) or body.get("object") != "response":
        raise bad("did not answer with a Responses object")
    if body.get("status") not in (None, "completed"):
        raise bad(f"answered with status {body.get('status')!r}")
    part = _output_text(body)
    if part is None:
        raise bad("gave no output text")
    try:
        answer = json.loads(part.get("text") or "")
    except ValueError:
        answer = None
    if answer not in options:
        raise bad(f"answered {str(part.get('text'))[:80]!r}, which is none of the options")
    index = options.index(answer)
    usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
    return Chosen(index, _probabilities(part.get("logprobs"), options, index),
                  input_tokens=int(usage.get("input_tokens") or 0),
                  output_tokens=int(usage.get("output_tokens") or 0),
                  cached_tokens=int((usage.get("input_tokens_details") or {})
                                    .get("cached_tokens") or 0))


def _output_text(body: dict[str, Any]) -> dict[str, Any] | None:
    for item in body.get("output") or []:
        if isinstance(item, dict) and item.get("type") == "message":
            for part in item.get("content") or []:
                if isinstance(part, dict) and part.get("type") == "output_text":
                    return part
    return None


def _probabilities(logprobs: Any, options: tuple[str, ...], chosen: int) -> tuple[float, ...]:
    alternatives = _first_alternatives(logprobs)
    if alternatives is None:
        return tuple(1.0 if i == chosen else 0.0 for i in range(len(options)))
    before, written, tops = alternatives
    logp = dict(tops)
    firsts: list[str | None] = []
    for i, quoted in enumerate(json.dumps(o) for o in options):
        if i == chosen:
            firsts.append(written)
            continue
        begins = [t for t in logp if quoted.startswith((before + t).lstrip())
                  or (before + t).lstrip().startswith(quoted)]
        firsts.append(max(begins, key=len) if begins else None)
    return spread(firsts, chosen, logp)


def _first_alternatives(logprobs: Any) -> tuple[str, str, list[tuple[str, float]]] | None:
    """The text before the first token that leaves the opening quote (``"``
    or nothing), that token, and its position's alternatives; None without
    logprobs."""
    if not isinstance(logprobs, list):
        return None
    before = ""
    for entry in logprobs:
        if not isinstance(entry, dict) or not isinstance(entry.get("token"), str):
            return None
        token = entry["token"]
        if (before + token).lstrip() not in ('"', ""):
            tops = [(t["token"], float(t["logprob"])) for t in entry.get("top_logprobs") or []
                    if isinstance(t, dict) and isinstance(t.get("token"), str)
                    and isinstance(t.get("logprob"), (int, float))]
            if not any(t == token for t, _ in tops):
                tops.append((token, float(entry.get("logprob") or 0.0)))
            return before, token, tops
        before += token
    return None
