"""Delegated work on a GPT-Live socket: ``session.delegation.created``, the
backend's Responses stream as ``response.event``, and the client's answers
(``response.item.create``, ``response.create``, ``session.commentary.append``).

Sans-I/O, owned by the codec (``codec.py``). The backend is the engine's own
LLM (``delegation.py`` gave the session the delegation's tools): a reply of
the session that calls a function *is* the delegation. So this part reads
the Realtime events the session makes and says what GPT-Live makes of them:

- Under ``responses``: the first function call of a reply opens a delegation
  (``session.delegation.created``, target ``responses``, ``response_id`` the
  reply's), and the reply's events are that backend run's Responses stream
  (``response.created``, ``response.output_item.added``/``.done``,
  ``response.function_call_arguments.delta``/``.done``,
  ``response.completed``; snapshots small, as the SDK says: no input, no
  instructions, tools or output). The client answers the calls with
  ``response.item.create`` (``function_call_output``: a Realtime
  ``function_call_output`` item) and continues with ``response.create``: a
  Realtime response tagged with the delegation (``metadata``), whose words
  the voice speaks and whose stream is the continuation's.
- Under ``client``: a call of ``DELEGATE_TOOL`` opens a delegation with
  target ``client``; the application answers with
  ``session.commentary.append`` naming it (the call's output), and the voice
  speaks from it.
- ``session.commentary.append`` without a delegation: speakable context, a
  system item asking the voice to tell the user now.

A reply the engine asks for (commentary, a continuation) while another is
shown waits for it to end (``due``), as GPT-Live's voice would finish its
sentence; one refused because a reply started first waits for that one.
"""

from __future__ import annotations

import itertools
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vllm_duplex.domain import events as ev
from vllm_duplex.domain.commands import Command, ItemCreate, ResponseCreate, ResponseOptions
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.realtime.wire.codec import RealtimeCodec
from vllm_duplex.realtime.wire.live.delegation import DELEGATE_TOOL
from vllm_duplex.realtime.wire.live.remote import RemoteRun
from vllm_duplex.realtime.wire.live.remote_turns import RemoteTurns

_TAG = "live_delegation"  # the response metadata key naming the delegation it continues
_COMMENTARY = "Tell the user this now, in your own words: {}"
_MORE = "More from the application on the task it was handed: {}"
_BUSY = "conversation_already_has_active_response"
_ASKED_KEPT = 64  # replies we asked for, remembered to tell their refusals apart
_CALL_EVENTS = (ev.OutputItemAdded, ev.OutputItemDone, ev.FunctionCallArgumentsDelta,
                ev.FunctionCallArgumentsDone)


@dataclass(frozen=True)
class LiveCommands:
    """Several commands one client event means, delivered in order."""

    commands: tuple[Command, ...]


def each_command(parsed: Any) -> tuple[Any, ...]:
    """What a parsed client event asks of the session, in order: a
    ``LiveCommands``' commands, or the one command."""
    return parsed.commands if isinstance(parsed, LiveCommands) else (parsed,)


@dataclass
class _Delegation:
    id: str
    target: str  # "responses" | "client"
    calls: dict[str, bool] = field(default_factory=dict)  # call_id -> answered
    running: bool = True  # a backend run of it is being made (calls not final yet)


@dataclass
class _Run:
    """One backend run: a Realtime response seen as a Responses stream."""

    delegation: _Delegation | None
    seq: int = 0
    created: bool = False


class Delegations:
    def __init__(self, realtime: RealtimeCodec, *, now_ms: Callable[[], int],
                 owe: Callable[[str, str, str | None], None],
                 wall: Callable[[], float] = time.time,
                 conversation: Callable[[], list[tuple[str, str]]] = list) -> None:
        self._realtime = realtime
        self._now_ms = now_ms
        self._owe = owe  # (item id, ack type, client event id): an *.appended owed
        self._wall = wall
        self.config: dict[str, Any] | None = None  # the accepted delegation (codec's)
        self._tag = secrets.token_hex(3)
        self._ids = (n for n in itertools.count(1))
        self._delegations: dict[str, _Delegation] = {}
        self._by_call: dict[str, _Delegation] = {}
        self._runs: dict[str, _Run] = {}  # response id -> its run, for backend responses
        self._shown: str | None = None  # the response the client is shown, if any
        self._deferred: list[ResponseCreate] = []  # replies to ask for once the floor is free
        self._asked: dict[str, tuple[ResponseCreate, str | None]] = {}  # ours -> (it, client eid)
        self._due: list[Command] = []
        # Delegations whose backend is an external Responses endpoint (remote_turns.py)
        self.remote = RemoteTurns(
            next_id=self._next, conversation=conversation,
            output_item=lambda call_id, text: self._parse_item(
                {"type": "function_call_output", "call_id": call_id, "output": text}, None),
            respond=lambda: self._respond(ResponseOptions(tool_choice="none"), None))

    # ---- config ---------------------------------------------------------------------

    @property
    def target(self) -> str | None:
        return (self.config or {}).get("type")

    def _backend(self) -> dict[str, Any]:
        return (self.config or {}).get("responses") or {}

    def _next(self, prefix: str) -> str:
        return f"{prefix}_live{self._tag}_{next(self._ids)}"

    # ---- client events ----------------------------------------------------------------

    def parse(self, kind: str, obj: dict[str, Any], eid: str | None
              ) -> Command | LiveCommands | RemoteRun:
        if kind == "session.commentary.append":
            return self._commentary(obj, eid)
        if self.target != "responses":
            raise DuplexError("invalid_value", f"{kind} requires responses delegation "
                              "(session.delegation.type: responses)", param="type")
        remote = self.remote.backend(self.config) is not None
        if kind == "response.item.create":
            item = obj.get("item")
            if isinstance(item, dict) and item.get("type") == "function_call_output" \
                    and self.remote.waits_for(item.get("call_id")):
                self.remote.output(item["call_id"], _output_text(item.get("output")))
                return LiveCommands(())  # the next run's input, not the session's
            return self._item(item, eid)
        assert kind == "response.create"
        if remote:
            return self.remote.continue_run(self.config or {}, eid)
        return self._continue(eid)

    def check_delegation_id(self, raw: Any) -> _Delegation | None:
        """An append's ``delegation_id``: null, or a client delegation made here."""
        if raw is None:
            return None
        if not isinstance(raw, str):
            raise DuplexError("invalid_value", "delegation_id must be a string or null",
                              param="delegation_id")
        if self.target == "responses":
            raise DuplexError("invalid_value", "a delegation_id is not accepted with responses "
                              "delegation", param="delegation_id")
        found = self._delegations.get(raw)
        if found is None or found.target != "client":
            raise DuplexError("invalid_value", f"no client delegation {raw!r} in this session",
                              param="delegation_id")
        return found

    def _commentary(self, obj: dict[str, Any], eid: str | None) -> LiveCommands:
        content = obj.get("content")
        if not isinstance(content, str) or not content.strip():
            raise DuplexError("invalid_value", "content must be a non-empty string",
                              param="content")
        delegation = self.check_delegation_id(obj.get("delegation_id"))
        open_call = next((c for c, answered in (delegation.calls.items() if delegation else ())
                          if not answered), None)
        if delegation is not None and open_call is not None:
            # The application's answer to the task: the output of the call that handed it over.
            delegation.calls[open_call] = True
            item = self._parse_item({"type": "function_call_output", "call_id": open_call,
                                     "output": content}, eid)
        else:
            text = (_MORE if delegation is not None else _COMMENTARY).format(content)
            item = self._parse_item({"type": "message", "role": "system",
                                     "content": [{"type": "input_text", "text": text}]}, eid)
        self._owe(item.item.id, "session.commentary.appended", eid)
        # The voice relays it: a reply in words, no new task (tools offered
        # here, a small model writes calls into what it says).
        return LiveCommands((item, *self._respond(ResponseOptions(tool_choice="none"), eid)))

    def _item(self, raw: Any, eid: str | None) -> ItemCreate:
        if not isinstance(raw, dict):
            raise DuplexError("invalid_value", "item must be an object", param="item")
        kind = raw.get("type")
        if kind == "function_call_output":
            call_id = raw.get("call_id")
            delegation = self._by_call.get(call_id) if isinstance(call_id, str) else None
            if delegation is None or call_id not in delegation.calls:
                raise DuplexError("invalid_value", f"no delegated function call {call_id!r} "
                                  "waits for an output", param="item.call_id")
            if delegation.calls[call_id]:
                raise DuplexError("invalid_value", f"function call {call_id!r} has its output "
                                  "already", param="item.call_id")
            output = _output_text(raw.get("output"))
            item = self._parse_item({"type": "function_call_output", "call_id": call_id,
                                     "output": output}, eid)
            delegation.calls[call_id] = True
            return item
        if kind in ("message", None) and "role" in raw:
            role = raw.get("role")
            if role not in ("user", "system", "developer"):
                raise DuplexError("invalid_value", "a backend message's role must be user, system "
                                  "or developer", param="item.role")
            text = _output_text(raw.get("content"), param="item.content")
            return self._parse_item({"type": "message",
                                     "role": "user" if role == "user" else "system",
                                     "content": [{"type": "input_text", "text": text}]}, eid)
        raise DuplexError("unsupported_option", f"response.item.create of {kind!r} items is not "
                          "supported here: function_call_output and text messages are",
                          param="item.type")

    def _parse_item(self, item: dict[str, Any], eid: str | None) -> ItemCreate:
        command = self._realtime.parse(json.dumps({
            "type": "conversation.item.create", "event_id": eid,
            "item": {"id": self._next("item"), **item}}))
        assert isinstance(command, ItemCreate)
        return command

    def _continue(self, eid: str | None) -> LiveCommands:
        """``response.create``: continue the delegation whose calls all have
        their outputs (or, with none waiting, a backend response of no delegation)."""
        waiting = [d for d in self._delegations.values()
                   if d.target == "responses" and not d.running and d.calls]
        for delegation in waiting:
            unanswered = [c for c, answered in delegation.calls.items() if not answered]
            if unanswered and len(unanswered) < len(delegation.calls):
                raise DuplexError("invalid_value", f"function call {unanswered[0]!r} has no output "
                                  "yet: send every output before response.create",
                                  param="type")
        ready = next((d for d in waiting if all(d.calls.values())), None)
        if waiting and ready is None:
            raise DuplexError("invalid_value", f"function call {next(iter(waiting[0].calls))!r} "
                              "has no output yet: send it with response.item.create first",
                              param="type")
        if ready is not None:
            for call_id in ready.calls:  # answered: the continuation may call again
                self._by_call.pop(call_id, None)
            ready.calls.clear()
            ready.running = True
        # A forced choice ("required", a named function) is the delegating
        # turn's: the continuation, whose context ends with the results,
        # answers in words (forced again, it would call again forever).
        choice = self._backend().get("tool_choice")
        forced = choice == "required" or isinstance(choice, dict)
        options = ResponseOptions(metadata={_TAG: ready.id if ready else ""},
                                  tool_choice="none" if forced else None)
        return LiveCommands(tuple(self._respond(options, eid)))

    def _respond(self, options: ResponseOptions, eid: str | None) -> list[ResponseCreate]:
        """A reply asked for on the client's behalf: now, or when the shown one ends."""
        command = ResponseCreate(options=options, event_id=self._next("ask"))
        self._asked[command.event_id or ""] = (command, eid)
        while len(self._asked) > _ASKED_KEPT:  # the oldest were taken long ago
            del self._asked[next(iter(self._asked))]
        if self._shown is not None:
            self._deferred.append(command)
            return []
        return [command]

    def due(self) -> list[Command]:
        """Commands to deliver now (replies that waited for the floor)."""
        out, self._due = self._due, []
        return out

    # ---- the session's events ---------------------------------------------------------

    def render(self, e: ev.ServerEvent) -> list[dict[str, Any]]:
        """The GPT-Live events (without ``event_id``) this session event
        means for delegations, sent before what the codec renders of it."""
        if self.remote.backend(self.config) is not None and isinstance(e, _CALL_EVENTS) \
                and (e.item.get("type") == "function_call" if hasattr(e, "item") else True):
            return self.remote.voice_call(e, self.config or {})  # the voice delegates
        if isinstance(e, ev.ResponseCreated):
            return self._created(e.response)
        if isinstance(e, ev.ResponseDone):
            return self._done(e.response)
        if isinstance(e, ev.OutputItemAdded) and e.item.get("type") == "function_call":
            return self._call_added(e)
        run = self._runs.get(getattr(e, "response_id", None) or "")
        if run is None or run.delegation is None or run.delegation.target != "responses":
            return []
        if isinstance(e, ev.FunctionCallArgumentsDelta):
            return [self._wrap(run, "response.function_call_arguments.delta", item_id=e.item_id,
                               output_index=e.output_index, delta=e.delta)]
        if isinstance(e, ev.FunctionCallArgumentsDone):
            return [self._wrap(run, "response.function_call_arguments.done", item_id=e.item_id,
                               output_index=e.output_index, arguments=e.arguments)]
        if isinstance(e, ev.OutputItemDone) and e.item.get("type") == "function_call":
            call_id = e.item["call_id"]
            run.delegation.calls.setdefault(call_id, False)
            self._by_call[call_id] = run.delegation
            return [self._wrap(run, "response.output_item.done", output_index=e.output_index,
                               item=_output_item(e.item))]
        return []

    def refused(self, error: DuplexError) -> bool:
        """Whether an error is about a reply we asked for and is ours to
        handle: one that lost the floor to a reply that started first waits
        for it (True: nothing to send). Any other refusal goes to the client
        under its own event id."""
        asked = self._asked.get(error.event_id or "")
        if asked is None:
            return False
        command, eid = asked
        if error.code == _BUSY:
            self._deferred.append(command)
            if self._shown is None:  # it ended before we heard: ask again now
                self._due.append(self._deferred.pop(0))
            return True
        del self._asked[error.event_id or ""]
        error.event_id = eid
        return False

    def _created(self, response: dict[str, Any]) -> list[dict[str, Any]]:
        self._shown = response["id"]
        tag = (response.get("metadata") or {}).get(_TAG)
        if tag is None:
            return []  # the voice's own reply: a delegation if it calls a tool
        run = self._runs[response["id"]] = _Run(self._delegations.get(tag))
        return [self._run_created(run, response)]

    def _call_added(self, e: ev.OutputItemAdded) -> list[dict[str, Any]]:
        run = self._runs.get(e.response_id)
        out: list[dict[str, Any]] = []
        if run is None or run.delegation is None:
            target = self.target
            if target not in ("client", "responses") or (
                    target == "client" and e.item.get("name") != DELEGATE_TOOL):
                return []
            delegation = _Delegation(self._next("deleg"), target)
            self._delegations[delegation.id] = delegation
            created = {"id": delegation.id, "type": "delegation", "target": target}
            if target == "responses":
                created["response_id"] = e.response_id
            out.append({"type": "session.delegation.created", "delegation": created,
                        "offset_ms": self._now_ms()})
            if run is None:
                run = self._runs[e.response_id] = _Run(delegation)
            run.delegation = delegation
            if target == "client":
                delegation.calls[e.item["call_id"]] = False
                self._by_call[e.item["call_id"]] = delegation
                return out
        if run.delegation is None or run.delegation.target != "responses":
            return out
        if not run.created:
            out.append(self._run_created(run, {"id": e.response_id}))
        out.append(self._wrap(run, "response.output_item.added", output_index=e.output_index,
                              item=_output_item(e.item)))
        return out

    def _run_created(self, run: _Run, response: dict[str, Any]) -> dict[str, Any]:
        run.created = True
        return self._wrap(run, "response.created",
                          response=self._snapshot(response, "in_progress"))

    def _done(self, response: dict[str, Any]) -> list[dict[str, Any]]:
        if self._shown == response["id"]:
            self._shown = None
            if self._deferred:
                self._due.append(self._deferred.pop(0))
        run = self._runs.pop(response["id"], None)
        if run is None or (run.delegation is None and not run.created):
            return []
        status = response.get("status")
        if run.delegation is not None:
            run.delegation.running = False
            if status != "completed":  # a run cut or failed: its calls are void, as GPT-Live's
                for call_id in run.delegation.calls:
                    self._by_call.pop(call_id, None)
                run.delegation.calls.clear()
        out: list[dict[str, Any]] = []
        if run.delegation is None or run.delegation.target == "responses":
            if run.delegation is None or not run.delegation.calls:
                # A run that answered in words: its message, then its end.
                for i, item in enumerate(response.get("output") or ()):
                    if item.get("type") == "message" and (msg := _output_item(item)):
                        out += [self._wrap(run, "response.output_item.added", output_index=i,
                                           item={**msg, "status": "in_progress", "content": []}),
                                self._wrap(run, "response.output_item.done", output_index=i,
                                           item=msg)]
            kind = {"completed": "response.completed",
                    "incomplete": "response.incomplete"}.get(status, "response.failed")
            out.append(self._wrap(run, kind, response=self._snapshot(response, status)))
        return out

    # ---- Responses shapes -------------------------------------------------------------

    def _wrap(self, run: _Run, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": run.seq, **fields}
        run.seq += 1
        return {"type": "response.event", "event": event,
                "delegation_id": run.delegation.id if run.delegation else None}

    def _snapshot(self, response: dict[str, Any], status: str | None) -> dict[str, Any]:
        """A small Responses ``Response``: no input, instructions, tools or output."""
        backend = self._backend()
        choice = backend.get("tool_choice") or "auto"
        out: dict[str, Any] = {
            "id": response["id"], "object": "response", "created_at": self._wall(),
            "model": backend.get("model") or "", "status": status, "output": [], "tools": [],
            "tool_choice": choice, "parallel_tool_calls": bool(backend.get("parallel_tool_calls")),
            "instructions": None, "error": None, "incomplete_details": None,
        }
        if status == "incomplete":
            out["incomplete_details"] = {"reason": "max_output_tokens"}
        elif status not in ("completed", "in_progress"):
            reason = ((response.get("status_details") or {}).get("reason")
                      or (response.get("status_details") or {}).get("type") or status)
            out["status"] = "failed"
            out["error"] = {"code": "server_error", "message": f"the backend run ended: {reason}"}
        usage = response.get("usage")
        if usage and status != "in_progress":
            out["usage"] = {"input_tokens": usage.get("input_tokens", 0),
                            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                            "output_tokens": usage.get("output_tokens", 0),
                            "output_tokens_details": {"reasoning_tokens": 0},
                            "total_tokens": usage.get("total_tokens", 0)}
        return out


def _output_item(item: dict[str, Any]) -> dict[str, Any] | None:
    """A Realtime output item as the Responses output item it is."""
    status = item.get("status") or "completed"
    if item.get("type") == "function_call":
        return {"type": "function_call", "id": item["id"], "call_id": item["call_id"],
                "name": item["name"], "arguments": item.get("arguments") or "",
                "status": status}
    if item.get("type") == "message":
        text = " ".join((p.get("text") or p.get("transcript") or "")
                        for p in item.get("content") or ()).strip()
        return {"type": "message", "id": item["id"], "role": "assistant",
                "status": "completed" if status == "completed" else "incomplete",
                "content": [{"type": "output_text", "text": text, "annotations": []}]}
    return None


def _output_text(raw: Any, param: str = "item.output") -> str:
    """A Responses output or content: a string, or text parts."""
    if isinstance(raw, str):
        return raw
    if isinstance(raw, list) and raw and all(
            isinstance(p, dict) and p.get("type") in ("input_text", "output_text")
            and isinstance(p.get("text"), str) for p in raw):
        return "".join(p["text"] for p in raw)
    raise DuplexError("invalid_value", f"{param} must be a string or a list of text parts",
                      param=param)
