"""The delegations of one GPT-Live socket that run on an external Responses
backend (``remote.py`` says what a run asks and what its stream means):
which are open, which backend calls wait for the client's outputs, and the
runs the shell is to make. Sans-I/O, owned by ``Delegations``
(``delegated.py``), which hands it the voice's function calls and the
client's answers when the delegation config names a backend.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm_duplex.domain import events as ev
from vllm_duplex.domain.backends import ResponsesBackend
from vllm_duplex.domain.commands import Command, ItemCreate
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.realtime.wire.live.remote import (
    Outcome,
    RemoteDelegation,
    RemoteRun,
    RemoteStream,
    conversation_input,
    created,
    next_input,
    request_body,
)

_FAILED = "The task could not be done: {}. Tell the user briefly."
_NO_WORDS = "The task was done, with nothing to say about it."


class RemoteTurns:
    def __init__(self, *, next_id: Callable[[str], str],
                 conversation: Callable[[], list[tuple[str, str]]],
                 output_item: Callable[[str, str], ItemCreate],
                 respond: Callable[[], list[Command]]) -> None:
        self.backends: dict[str, ResponsesBackend] = {}  # the deployment's (host/backends.py)
        self._next = next_id
        self._conversation = conversation  # as the client heard it
        self._output_item = output_item  # (voice call id, text): its function_call_output
        self._respond = respond  # the voice's reply in words, now or when the floor is free
        self._open: dict[str, RemoteDelegation] = {}
        self._by_call: dict[str, RemoteDelegation] = {}  # a backend call_id -> its delegation
        self._runs: list[RemoteRun] = []

    def backend(self, config: dict[str, Any] | None) -> ResponsesBackend | None:
        """The backend a ``responses`` delegation config names, if any."""
        if (config or {}).get("type") != "responses":
            return None
        return self.backends.get(((config or {}).get("responses") or {}).get("model") or "")

    # ---- the voice delegates --------------------------------------------------------

    def voice_call(self, e: ev.ServerEvent, config: dict[str, Any]) -> list[dict[str, Any]]:
        """A function call event of the voice's reply: nothing for the client;
        the call done opens a delegation and asks for its first run."""
        if isinstance(e, ev.OutputItemDone) and e.item.get("type") == "function_call":
            backend = self.backend(config)
            assert backend is not None
            delegation = RemoteDelegation(self._next("deleg"), backend, e.item["call_id"],
                                          conversation_input(self._conversation()))
            self._open[delegation.id] = delegation
            self._runs.append(self._run(delegation, config, continuation=False))
        return []

    def take_runs(self) -> list[RemoteRun]:
        out, self._runs = self._runs, []
        return out

    def stream(self, run: RemoteRun) -> RemoteStream:
        return RemoteStream(self._open[run.delegation_id])

    # ---- the client answers ---------------------------------------------------------

    def waits_for(self, call_id: Any) -> bool:
        return isinstance(call_id, str) and call_id in self._by_call

    def output(self, call_id: str, output: str) -> None:
        """A ``function_call_output`` for a backend's call: the next run's input."""
        delegation = self._by_call[call_id]
        if delegation.calls.get(call_id):
            raise DuplexError("invalid_value", f"function call {call_id!r} has its output "
                              "already", param="item.call_id")
        delegation.calls[call_id] = True
        delegation.input.append({"type": "function_call_output", "call_id": call_id,
                                 "output": output})

    def continue_run(self, config: dict[str, Any], eid: str | None) -> RemoteRun:
        """``response.create``: the delegation whose calls all have outputs runs again."""
        waiting = [d for d in self._open.values() if not d.running and d.calls]
        ready = next((d for d in waiting if all(d.calls.values())), None)
        if ready is None:
            raise DuplexError("invalid_value", "no delegated run waits for response.create "
                              "(send every function_call_output with response.item.create "
                              "first)" if waiting else "no delegated run waits for "
                              "response.create", param="type")
        for call_id in ready.calls:
            self._by_call.pop(call_id, None)
        ready.calls.clear()
        ready.running = True
        run = self._run(ready, config, continuation=True)
        return RemoteRun(run.delegation_id, run.backend, run.body, eid)

    def _run(self, delegation: RemoteDelegation, config: dict[str, Any], *,
             continuation: bool) -> RemoteRun:
        body = request_body(delegation.backend, (config.get("responses") or {}),
                            list(delegation.input), continuation=continuation)
        return RemoteRun(delegation.id, delegation.backend, body)

    # ---- a run ends -----------------------------------------------------------------

    def finished(self, run: RemoteRun, outcome: Outcome | DuplexError) -> list[Command]:
        """A run is over: its calls wait for the client, or the delegation
        ends and the voice speaks its words (or that it failed)."""
        delegation = self._open.get(run.delegation_id)
        if delegation is None:
            return []
        delegation.running = False
        if isinstance(outcome, Outcome) and outcome.status == "completed" and outcome.calls:
            next_input(delegation, outcome)
            for call in outcome.calls:
                self._by_call[call["call_id"]] = delegation
            return []
        del self._open[delegation.id]
        for call_id in delegation.calls:
            self._by_call.pop(call_id, None)
        if isinstance(outcome, DuplexError):
            said = _FAILED.format("the backend did not answer" if outcome.code ==
                                  "deadline_exceeded" else "the backend failed")
        elif outcome.status == "failed":
            said = _FAILED.format("the backend failed")
        else:
            said = outcome.text or _NO_WORDS
        return [self._output_item(delegation.voice_call, said), *self._respond()]

    def created_unannounced(self, run: RemoteRun) -> list[dict[str, Any]]:
        """``session.delegation.created`` for a run that failed before its
        backend said anything, so the error follows a delegation the client knows."""
        found = self._open.get(run.delegation_id)
        return [created(found, None)] if found is not None and not found.announced else []
