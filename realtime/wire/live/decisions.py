"""GPT-Live Decisions on the wire (sans-I/O): the ``decisions`` delegation
config, ``triggers``, ``decision.item.create`` / ``.delete`` and
``decision.create``, and the ``decision.event`` that answers them.

``Decisions`` is the codec's part that owns a session's Decision inputs:
its items (answered at once, ``decision.item.created`` / ``.deleted``), the
conversation as the client heard it (the user's final transcripts, the
voice's transcript reply by reply, from the events the codec renders), the
``event_id``s ``decision.create`` used (GPT-Live: "Reusing an event_id is
rejected for the lifetime of the session") and the triggers.

``decision.create`` and a trigger firing become a ``DecisionRun``: the
questions and their ``ChoiceAsk``s (``decision_eval.py``), snapshotted when
the run is made, which the shell (``realtime/server/live/decisions.py``)
answers and renders with ``render_decision``. A ``decision.create`` is a
delegation to Decisions: ``session.delegation.created`` names it at once,
and its ``decision.event`` carries that ``delegation_id``.

A trigger fires once per turn, on the turn's last transcript fragment of
its ``event_type`` (the user's turn: when its final transcript is in; the
voice's: when its reply ends), which the ``decision.event`` names as its
``source_event_id`` -- rather than on every fragment, which would put one
evaluation per word on the engine that is also speaking.
"""

from __future__ import annotations

import itertools
import secrets
from dataclasses import dataclass
from typing import Any

from vllm_duplex.domain.decisions import ChoiceAsk, Chosen
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.payloads import ContextMessage
from vllm_duplex.realtime.wire.live import decision_eval
from vllm_duplex.realtime.wire.live.decision_eval import check_questions, part_text

DECISION_EVENTS = ("decision.create", "decision.item.create", "decision.item.delete")
TRIGGER_TYPES = ("session.input_transcript.delta", "session.output_transcript.delta")
MAX_ITEMS = 64  # Decision items a session holds (each is in every decision's prompt)
_PARTS = {"system": ("input_text",), "developer": ("input_text",),
          "user": ("input_text", "input_image", "input_json"),
          "assistant": ("output_text", "refusal")}
_NO_BACKEND = ("Decisions (decision.create, triggers) are evaluated on an LLM stage; this "
               "deployment has none")


@dataclass(frozen=True)
class DecisionRun:
    """One evaluation: ``asks`` (one per question, in order) to answer;
    ``event_id`` and ``delegation_id`` for a ``decision.create``,
    ``trigger_id`` and the source fragment for a trigger."""

    questions: tuple[dict[str, Any], ...]
    asks: tuple[ChoiceAsk, ...]
    event_id: str | None = None
    delegation_id: str | None = None
    trigger_id: str | None = None
    source_event_id: str | None = None
    source_event_type: str | None = None


@dataclass(frozen=True)
class ItemReply:
    """``decision.item.created`` / ``.deleted``: answered at once."""

    type: str
    fields: dict[str, Any]
    event_id: str | None = None


def check_decisions(raw: Any, *, update: bool, param: str) -> dict[str, Any]:
    """A ``decisions`` delegation's config (``DecisionsDelegationConfig``; on
    an update, ``DecisionsDelegationUpdateConfig``: both fields optional)."""
    if not isinstance(raw, dict):
        raise DuplexError("invalid_value", f"{param} must be an object", param=param)
    out: dict[str, Any] = {}
    model = raw.get("model")
    if model is not None or not update:
        if not isinstance(model, str) or not model:
            raise DuplexError("invalid_value", f"{param}.model must be a non-empty string",
                              param=f"{param}.model")
        out["model"] = model
    questions = raw.get("questions")
    if questions is not None or not update:
        out["questions"] = check_questions(questions, f"{param}.questions")
    return out


class Decisions:
    def __init__(self) -> None:
        tag = secrets.token_hex(3)
        self._item_ids = (f"ditem_{tag}_{n}" for n in itertools.count(1))
        self._delegation_ids = (f"deleg_{tag}_{n}" for n in itertools.count(1))
        self._trigger_ids = (f"trig_{tag}_{n}" for n in itertools.count(1))
        self.available = True  # whether a backend evaluates them (the shell says)
        self.items: dict[str, dict[str, Any]] = {}  # id -> the stored item, in order
        self._used: set[str] = set()  # decision.create event_ids, for the session's life
        self.triggers: dict[str, list[dict[str, Any]]] = {}  # event_type -> questions
        self.conversation: list[tuple[str, str]] = []  # (user | assistant, text)
        self._reply = ""  # the voice's transcript of the reply going on
        self._reply_source: str | None = None  # its last fragment's event_id
        self._runs: list[DecisionRun] = []  # trigger firings for the shell to take

    # ---- config ------------------------------------------------------------------------

    def check_triggers(self, raw: Any, param: str = "session.triggers"
                       ) -> dict[str, list[dict[str, Any]]] | None:
        """``triggers`` as configured (event_type -> questions); None: leave
        them as they are (omitted); ``{}``: none (an empty list)."""
        if raw is None:
            return None
        if not isinstance(raw, list):
            raise DuplexError("invalid_value", f"{param} must be a list", param=param)
        if raw and not self.available:
            raise DuplexError("capability_unsupported", _NO_BACKEND, param=param)
        out: dict[str, list[dict[str, Any]]] = {}
        for i, t in enumerate(raw):
            p = f"{param}[{i}]"
            if not isinstance(t, dict) or t.get("type") != "decisions":
                raise DuplexError("invalid_value", f"{p}.type must be decisions", param=f"{p}.type")
            kind = t.get("event_type")
            if kind not in TRIGGER_TYPES:
                raise DuplexError("invalid_value", f"{p}.event_type must be one of "
                                  f"{', '.join(TRIGGER_TYPES)}", param=f"{p}.event_type")
            if kind in out:
                raise DuplexError("invalid_value", "at most one trigger per event_type",
                                  param=f"{p}.event_type")
            decisions = t.get("decisions")
            if not isinstance(decisions, dict):
                raise DuplexError("invalid_value", f"{p}.decisions must be an object",
                                  param=f"{p}.decisions")
            out[kind] = check_questions(decisions.get("questions"), f"{p}.decisions.questions")
        return out

    # ---- client events -----------------------------------------------------------------

    def parse(self, kind: str, obj: dict[str, Any], eid: str | None,
              delegation: dict[str, Any] | None) -> DecisionRun | ItemReply:
        if kind == "decision.item.create":
            item = self._stored(obj.get("item"))
            self.items[item["id"]] = item
            return ItemReply("decision.item.created", {"item": item}, eid)
        if kind == "decision.item.delete":
            item_id = obj.get("item_id")
            if not isinstance(item_id, str):
                raise DuplexError("invalid_value", "item_id must be a string", param="item_id")
            if self.items.pop(item_id, None) is None:
                raise DuplexError("item_not_found", f"no Decision item {item_id!r}",
                                  param="item_id")
            return ItemReply("decision.item.deleted", {"item_id": item_id}, eid)
        assert kind == "decision.create"
        if eid is None:
            raise DuplexError("invalid_value", "decision.create needs an event_id",
                              param="event_id")
        if eid in self._used:
            raise DuplexError("duplicate_id", f"event_id {eid!r} was used by a decision.create "
                              "of this session already", param="event_id")
        if not self.available:
            raise DuplexError("capability_unsupported", _NO_BACKEND, param="type")
        if not delegation or delegation.get("type") != "decisions":
            raise DuplexError("invalid_value", "decision.create evaluates the questions of a "
                              "decisions delegation; this session's delegation is not one "
                              "(session.delegation.type)", param="type")
        self._used.add(eid)
        questions = delegation["decisions"]["questions"]
        return DecisionRun(tuple(questions), self._asks(questions), event_id=eid,
                           delegation_id=next(self._delegation_ids))

    def _stored(self, raw: Any) -> dict[str, Any]:
        """A ``decision.item.create``'s item as the SDK's stored message."""
        p = "item"
        if not isinstance(raw, dict):
            raise DuplexError("invalid_value", f"{p} must be an object", param=p)
        if raw.get("type") not in (None, "message"):
            raise DuplexError("unsupported_option", "Decision items are messages here (tool "
                              "calls and their outputs are not supported)", param=f"{p}.type")
        role = raw.get("role")
        if role not in _PARTS:
            raise DuplexError("invalid_value", f"{p}.role must be system, developer, user or "
                              "assistant", param=f"{p}.role")
        content = raw.get("content")
        if isinstance(content, list) and content:
            for i, part in enumerate(content):
                part_text(part, f"{p}.content[{i}]", _PARTS[role])
        elif not isinstance(content, str) or not content.strip():
            raise DuplexError("invalid_value", f"{p}.content must be a non-empty string or "
                              "list of parts", param=f"{p}.content")
        item_id = raw.get("id")
        if item_id is None:
            item_id = next(self._item_ids)
        elif not isinstance(item_id, str) or not item_id:
            raise DuplexError("invalid_value", f"{p}.id must be a non-empty string",
                              param=f"{p}.id")
        elif item_id in self.items:
            raise DuplexError("duplicate_id", f"a Decision item {item_id!r} exists already",
                              param=f"{p}.id")
        if len(self.items) >= MAX_ITEMS:
            raise DuplexError("resource_exhausted", f"a session holds at most {MAX_ITEMS} "
                              "Decision items; delete one first", param=p)
        phase = raw.get("phase")
        if phase is not None and (role != "assistant" or phase not in ("commentary",
                                                                        "final_answer")):
            raise DuplexError("invalid_value", f"{p}.phase is commentary or final_answer, on an "
                              "assistant message", param=f"{p}.phase")
        item = {"id": item_id, "type": "message", "role": role, "content": content}
        if phase is not None:
            item["phase"] = phase
        return item

    def _asks(self, questions: list[dict[str, Any]]) -> tuple[ChoiceAsk, ...]:
        items = []
        for item in self.items.values():
            content = item["content"]
            text = content if isinstance(content, str) else "\n".join(
                part_text(part, "item.content", _PARTS[item["role"]]) for part in content)
            role = "system" if item["role"] == "developer" else item["role"]
            items.append(ContextMessage(role, text, item_id=item["id"]))
        conversation = [*self.conversation]
        if self._reply.strip():  # the voice's reply so far, as the client has heard it
            conversation.append(("assistant", self._reply))
        return tuple(decision_eval.asks(questions, conversation, items))

    # ---- what the codec renders --------------------------------------------------------

    def heard(self, transcript: str, source_event_id: str | None) -> None:
        """The user's turn is in (its final transcript); ``source_event_id``:
        its last input fragment."""
        if transcript.strip():
            self.conversation.append(("user", transcript.strip()))
        self._fire("session.input_transcript.delta", source_event_id)

    def spoke(self, delta: str, event_id: str | None) -> None:
        self._reply += delta
        self._reply_source = event_id

    def reply_done(self) -> None:
        text, source = self._reply.strip(), self._reply_source
        self._reply, self._reply_source = "", None
        if text:
            self.conversation.append(("assistant", text))
        self._fire("session.output_transcript.delta", source)

    def _fire(self, kind: str, source: str | None) -> None:
        questions = self.triggers.get(kind)
        if questions and source is not None:
            self._runs.append(DecisionRun(tuple(questions), self._asks(questions),
                                          trigger_id=next(self._trigger_ids),
                                          source_event_id=source, source_event_type=kind))

    def take_runs(self) -> list[DecisionRun]:
        runs, self._runs = self._runs, []
        return runs


def decision_event(run: DecisionRun, model: str, chosen: list[Chosen]) -> dict[str, Any]:
    """The fields of ``run``'s ``decision.event`` (the SDK's ``DecisionEvent``)."""
    return {"delegation_id": run.delegation_id, "trigger_id": run.trigger_id,
            "source_event_id": run.source_event_id, "source_event_type": run.source_event_type,
            "event": {"type": "decision.completed",
                      "decision": decision_eval.decision(model, run.questions, chosen)}}
