"""GPT-Live Decisions, evaluated: questions in, a ``Decision`` out (sans-I/O).

A Decisions question (``openai/types/live/decision_question.py``) is a
``choice`` (one of its values), a ``score`` (a position on its ordered
levels) or a ``predicate`` (how likely a statement holds). Each is asked as
one ``ChoiceAsk`` -- the conversation, the session's Decision items and the
question, with the options its answer must be one of -- and a ``Chooser``
answers it (on this engine: its own LLM under vLLM structured outputs, so the
answer is always one of the options). The answers come back as the SDK's
``Decision`` (``openai/types/decision.py``), in question order:

- ``predicate``: asked as yes / no; ``probability`` is P(yes).
- ``choice``: ``choice`` is the value chosen, ``confidence`` its probability,
  ``probabilities`` every value's.
- ``score``: the levels are indexed from 0 in the order given; ``score`` is
  the probability-weighted mean of those indices (so it may fall between two
  levels, and always lies within them), ``confidence`` the probability of
  the level chosen.

Nothing here waits: the shell (``realtime/server/live/decisions.py``) runs
the asks and hands the answers back.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from vllm_duplex.domain.decisions import ChoiceAsk, Chosen
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.payloads import ContextMessage

# The judge's standing rule, before anything the client gave.
JUDGE = ("You judge a conversation between a user and a voice assistant. Answer the "
         "question about it with exactly one of the options.")
PREDICATE_OPTIONS = ("yes", "no")
# The newest conversation kept in a prompt (characters): the context of a
# small model is short, and a decision is about what was said lately.
MAX_CONVERSATION_CHARS = 3000
MAX_QUESTIONS = 16
_IMAGES = "images are not supported by this engine's Decisions (its LLM reads text only)"


# ---- questions ---------------------------------------------------------------------


def check_questions(raw: Any, param: str) -> list[dict[str, Any]]:
    """The questions as given, validated as the SDK's ``DecisionQuestion``
    union (a typed error naming the bad field otherwise)."""
    if not isinstance(raw, list) or not raw:
        raise DuplexError("invalid_value", f"{param} must be a non-empty list", param=param)
    if len(raw) > MAX_QUESTIONS:
        raise DuplexError("invalid_value", f"{param} holds at most {MAX_QUESTIONS} questions",
                          param=param)
    return [_check_question(q, f"{param}[{i}]") for i, q in enumerate(raw)]


def _check_question(q: Any, p: str) -> dict[str, Any]:
    if not isinstance(q, dict):
        raise DuplexError("invalid_value", f"{p} must be an object", param=p)
    kind = q.get("type")
    if kind not in ("choice", "score", "predicate"):
        raise DuplexError("invalid_value", f"{p}.type must be choice, score or predicate",
                          param=f"{p}.type")
    if q.get("name") is not None and not isinstance(q["name"], str):
        raise DuplexError("invalid_value", f"{p}.name must be a string", param=f"{p}.name")
    instructions_text(q.get("instructions"), f"{p}.instructions")
    if kind == "choice":
        choices = q.get("choices")
        if not isinstance(choices, list) or len(choices) < 2:
            raise DuplexError("invalid_value", f"{p}.choices must list at least two choices",
                              param=f"{p}.choices")
        for i, c in enumerate(choices):
            if not isinstance(c, dict) or not isinstance(c.get("value"), (str, bool)):
                raise DuplexError("invalid_value", f"{p}.choices[{i}].value must be a string or "
                                  "a boolean", param=f"{p}.choices[{i}].value")
            _check_description(c, f"{p}.choices[{i}]")
        texts = [_value_text(c["value"]) for c in choices]
        if len(set(texts)) != len(texts) or not all(t.strip() for t in texts):
            # "true" and true are distinct values to the SDK, but one text to a model.
            raise DuplexError("invalid_value", f"{p}.choices must be distinct and non-blank as "
                              "text", param=f"{p}.choices")
    if kind == "score":
        levels = q.get("levels")
        if not isinstance(levels, list) or len(levels) < 2:
            raise DuplexError("invalid_value", f"{p}.levels must list at least two levels",
                              param=f"{p}.levels")
        for i, level in enumerate(levels):
            if not isinstance(level, dict) or not isinstance(level.get("label"), str) \
                    or not level["label"].strip():
                raise DuplexError("invalid_value", f"{p}.levels[{i}].label must be a non-empty "
                                  "string", param=f"{p}.levels[{i}].label")
            _check_description(level, f"{p}.levels[{i}]")
        labels = [level["label"] for level in levels]
        if len(set(labels)) != len(labels):
            raise DuplexError("invalid_value", f"{p}.levels' labels must be distinct",
                              param=f"{p}.levels")
    return q


def _check_description(obj: dict[str, Any], p: str) -> None:
    if obj.get("description") is not None and not isinstance(obj["description"], str):
        raise DuplexError("invalid_value", f"{p}.description must be a string",
                          param=f"{p}.description")


def instructions_text(raw: Any, p: str) -> str:
    """A question's instructions (a string, or input_text / input_json parts) as text."""
    if isinstance(raw, str):
        if not raw.strip():
            raise DuplexError("invalid_value", f"{p} must not be blank", param=p)
        return raw
    if not isinstance(raw, list) or not raw:
        raise DuplexError("invalid_value", f"{p} must be a string or a list of parts", param=p)
    return "\n".join(part_text(part, f"{p}[{i}]", ("input_text", "input_image", "input_json"))
                     for i, part in enumerate(raw))


def part_text(part: Any, p: str, kinds: Sequence[str]) -> str:
    """One content part as text: ``input_text`` / ``output_text`` as written,
    ``input_json`` as JSON, ``refusal`` as its text; images refused by name."""
    if not isinstance(part, dict):
        raise DuplexError("invalid_value", f"{p} must be an object", param=p)
    kind = part.get("type")
    if kind == "input_image" and "input_image" in kinds:
        raise DuplexError("unsupported_option", _IMAGES, param=f"{p}.type")
    if kind not in kinds or kind == "input_image":
        raise DuplexError("invalid_value", f"{p}.type must be one of {', '.join(kinds)}",
                          param=f"{p}.type")
    if kind == "input_json":
        data = part.get("data")
        if not isinstance(data, dict) and not (isinstance(data, list)
                                               and all(isinstance(d, dict) for d in data)):
            raise DuplexError("invalid_value", f"{p}.data must be an object or a list of objects",
                              param=f"{p}.data")
        return json.dumps(data, ensure_ascii=False)
    field = "refusal" if kind == "refusal" else "text"
    if not isinstance(part.get(field), str):
        raise DuplexError("invalid_value", f"{p}.{field} must be a string", param=f"{p}.{field}")
    return part[field]


def _value_text(value: str | bool) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else value


def options(q: dict[str, Any]) -> tuple[str, ...]:
    """What the answer to ``q`` must be one of, as text."""
    if q["type"] == "predicate":
        return PREDICATE_OPTIONS
    if q["type"] == "choice":
        return tuple(_value_text(c["value"]) for c in q["choices"])
    return tuple(level["label"] for level in q["levels"])


# ---- asks --------------------------------------------------------------------------


def asks(questions: Sequence[dict[str, Any]], conversation: Sequence[tuple[str, str]],
         items: Sequence[ContextMessage]) -> list[ChoiceAsk]:
    """One ``ChoiceAsk`` per question, in order, each on the same inputs:
    the judge's rule, the Decision items (as the messages they are), then the
    conversation (``(role, text)`` lines, newest kept) and the question."""
    transcript = _transcript(conversation)
    head = (ContextMessage("system", JUDGE), *items)
    return [ChoiceAsk((*head, ContextMessage("user", _question(q, transcript))), options(q))
            for q in questions]


def _transcript(conversation: Sequence[tuple[str, str]]) -> str:
    lines: list[str] = []
    size = 0
    for role, text in reversed(conversation):
        line = f"{'User' if role == 'user' else 'Assistant'}: {text.strip()}"
        size += len(line) + 1
        if size > MAX_CONVERSATION_CHARS and lines:
            break
        lines.append(line[-MAX_CONVERSATION_CHARS:])
    return "\n".join(reversed(lines)) or "(nothing has been said yet)"


def _question(q: dict[str, Any], transcript: str) -> str:
    if q["type"] == "predicate":
        described = [("yes", None), ("no", None)]
    elif q["type"] == "choice":
        described = [(_value_text(c["value"]), c.get("description")) for c in q["choices"]]
    else:
        described = [(level["label"], level.get("description")) for level in q["levels"]]
    opts = "\n".join(f"- {text}" + (f": {about}" if about else "") for text, about in described)
    ask = instructions_text(q["instructions"], "instructions")
    return f"Conversation:\n{transcript}\n\nQuestion: {ask}\nOptions:\n{opts}"


# ---- answers -----------------------------------------------------------------------


def answer(q: dict[str, Any], chosen: Chosen) -> dict[str, Any]:
    """The SDK's ``Decision`` answer to ``q`` from its ``Chosen``."""
    probs = chosen.probabilities
    out: dict[str, Any] = {"type": q["type"], "name": q.get("name")}
    if q["type"] == "predicate":
        out["probability"] = probs[0]
    elif q["type"] == "choice":
        values = [c["value"] for c in q["choices"]]
        out.update(choice=values[chosen.index], confidence=probs[chosen.index],
                   probabilities=[{"value": v, "probability": p} for v, p in zip(values, probs)])
    else:
        labels = [level["label"] for level in q["levels"]]
        out.update(score=sum(i * p for i, p in enumerate(probs)),
                   confidence=probs[chosen.index],
                   probabilities=[{"label": label, "value": i, "probability": p}
                                  for i, (label, p) in enumerate(zip(labels, probs))])
    return out


def decision(model: str, questions: Sequence[dict[str, Any]],
             chosen: Sequence[Chosen]) -> dict[str, Any]:
    """The SDK's ``Decision``: answers in question order, the model, usage."""
    inputs = sum(c.input_tokens for c in chosen)
    outputs = sum(c.output_tokens for c in chosen)
    return {"answers": [answer(q, c) for q, c in zip(questions, chosen, strict=True)],
            "model": model,
            "usage": {"input_tokens": inputs, "output_tokens": outputs,
                      "total_tokens": inputs + outputs,
                      "input_tokens_details": {"cached_tokens": sum(c.cached_tokens
                                                                    for c in chosen),
                                               "cache_write_tokens": 0},
                      "output_tokens_details": {"reasoning_tokens": 0}}}
