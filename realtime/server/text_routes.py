"""HTTP routes of the text surfaces (a thin shell over ``TextService``).

- ``POST /v1/generate``                     stateless single step (SSE; ``stream: false`` → JSON)
- ``POST /v1/sessions`` · ``GET|DELETE /v1/sessions/{id}`` · ``POST …/renew``
- ``POST /v1/sessions/{id}/generate``       continue an application session
- ``POST /v1/streams/lookup`` · ``GET|DELETE /v1/streams/{id}`` · ``POST …/control``
- ``POST /v1/requests/{request_id}/abort``

Errors are ``{"error": {...}}`` with the status of ``vllm_duplex.core.errors``.
Every id is scoped to the API key that made it: any other key gets 404.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from vllm_duplex.core.errors import ERRORS, DuplexError
from vllm_duplex.realtime.server.sse import EventStreamResponse, sse_frame
from vllm_duplex.text.app_sessions import AppSession, TurnRequest
from vllm_duplex.text.events import (
    ErrorEvent,
    FinishEvent,
    ReasoningDeltaEvent,
    TextDeltaEvent,
    TextEvent,
    ToolCallEvent,
    from_wire,
)
from vllm_duplex.text.requests import (
    Message,
    check_model,
    parse_control,
    parse_generate,
    parse_messages,
)

if TYPE_CHECKING:
    from vllm_duplex.text.service import TextService

OWNER_HEADER = "duplex-owner-instance"
Handler = Callable[[Request, "Caller"], Awaitable[Response]]


class Caller:
    """Who is asking: the API key (checked) and its owner id (HMAC)."""

    def __init__(self, api_key: str | None, key_id: str | None) -> None:
        self.api_key = api_key
        self.key_id = key_id


def error_response(err: DuplexError) -> JSONResponse:
    return JSONResponse({"error": err.to_wire()}, status_code=err.spec.http_status)


def answer(body: dict[str, Any]) -> JSONResponse:
    """A ``stream: false`` answer; a step that ended in an error has that
    error's status (what came out before it is in ``output``)."""
    error = body.get("error")
    status = ERRORS[error["code"]].http_status if error and error.get("code") in ERRORS else 200
    return JSONResponse(body, status_code=status)


async def read_json(request: Request, limit: int) -> Any:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise DuplexError("payload_too_large", f"bodies are at most {limit} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise DuplexError("payload_too_large", f"bodies are at most {limit} bytes")
    if not body:
        return {}
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise DuplexError("invalid_json", "the body is not JSON") from None


async def collect(events: AsyncIterator[TextEvent]) -> dict[str, Any]:
    """A whole step as one JSON answer (``stream: false``)."""
    text: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    result: dict[str, Any] = {}
    async for ev in events:
        if isinstance(ev, TextDeltaEvent):
            text.append(ev.delta)
        elif isinstance(ev, ReasoningDeltaEvent):
            reasoning.append(ev.delta)
        elif isinstance(ev, ToolCallEvent):
            calls.append({"id": ev.id, "type": "function", "function": {
                "name": ev.name, "arguments": ev.arguments}})
        elif isinstance(ev, (FinishEvent, ErrorEvent)):
            result = ev.data()
    return {"output": {"text": "".join(text), "reasoning": "".join(reasoning), "tool_calls": calls},
            **result}


async def frames(events: AsyncIterator[TextEvent]) -> AsyncIterator[bytes]:
    try:
        async for ev in events:
            yield sse_frame(ev.type, ev.data())
    finally:
        await events.aclose()  # type: ignore[attr-defined]


def text_routes(service_of: Callable[[], TextService | None],
                authorize: Callable[[Request], str | None]) -> list[Route]:
    """``service_of()`` is None when the deployment has no vLLM text stage."""

    def endpoint(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def run(request: Request) -> Response:
            try:
                key = authorize(request)
                service = service_of()
                if service is None:
                    raise DuplexError("capability_unsupported",
                                      "this deployment has no vLLM text stage")
                request.state.service = service
                return await handler(request, Caller(key, service.key_id(key)))
            except DuplexError as err:
                return error_response(err)
        return run

    def svc(request: Request) -> TextService:
        return request.state.service

    async def body_of(request: Request) -> Any:
        return await read_json(request, svc(request).limits.max_request_bytes)

    # ---- stateless generate ------------------------------------------------

    async def generate(request: Request, caller: Caller) -> Response:
        service = svc(request)
        raw = await body_of(request)
        stream = raw.pop("stream", True) if isinstance(raw, dict) else True
        if not isinstance(stream, bool):
            raise DuplexError("invalid_value", "stream must be a boolean", param="stream")
        spec = parse_generate(raw, served_model=service.model, max_tokens_cap=service.max_tokens_cap,
                              owner=service.sessions.instance_id)
        control = spec.control()
        run = service.generator.start(spec, control)
        if spec.stream_id is not None:
            target = service.open_stream(spec.stream_id, caller.key_id, spec.request_id)
            service.publish(target, run, service.run(caller.key_id, spec.request_id, run,
                                                     run.events(), spec.deadline_ms), control)
            return follow(target, 1, stream)
        service.reserve(caller.key_id, spec.request_id)
        events = service.run(caller.key_id, spec.request_id, run, run.events(), spec.deadline_ms)
        if not stream:
            return answer(await collect(events))
        return EventStreamResponse(frames(events), {"x-request-id": spec.request_id})

    def follow(target: Any, from_seq: int, stream: bool = True) -> Response:
        target.check_cursor(from_seq)
        events = target.follow(from_seq)

        async def replay() -> AsyncIterator[bytes]:
            try:
                async for ev in events:
                    yield sse_frame(ev.event, ev.data, ev.seq)
            except DuplexError as err:
                failed = ErrorEvent(err)
                yield sse_frame(failed.type, failed.data())
            finally:
                await events.aclose()

        if not stream:
            async def as_events() -> AsyncIterator[TextEvent]:
                async for ev in events:
                    yield from_wire(ev.event, ev.data)

            async def whole() -> Response:
                return answer({"stream_id": target.stream_id, **await collect(as_events())})
            return _Deferred(whole)
        return EventStreamResponse(replay(), {"x-stream-id": target.stream_id})

    # ---- application sessions ------------------------------------------------

    def owner(request: Request) -> str | None:
        return request.headers.get(OWNER_HEADER)

    async def open_session(request: Request, caller: Caller) -> Response:
        service = svc(request)
        raw = await body_of(request)
        if not isinstance(raw, dict):
            raise DuplexError("invalid_value", "the body must be a JSON object", param="body")
        unknown = set(raw) - {"model", "adapter", "session_id", "ttl_s", "instructions", "messages"}
        if unknown:
            name = sorted(unknown)[0]
            raise DuplexError("unsupported_option", f"{name} is not supported here", param=name)
        model = check_model(raw.get("model"), service.model)
        if raw.get("adapter") is not None:
            raise DuplexError("model_not_found", f"adapter {raw['adapter']!r} is not served here "
                              "(this engine serves no adapters)", param="adapter")
        ttl = raw.get("ttl_s")
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, (int, float))):
            raise DuplexError("invalid_value", "ttl_s must be a number", param="ttl_s")
        messages = parse_messages(raw.get("messages", []), allow_empty=True)
        instructions = raw.get("instructions")
        if instructions is not None:
            if not isinstance(instructions, str):
                raise DuplexError("invalid_value", "instructions must be a string", param="instructions")
            messages = (Message("system", instructions), *messages)
        session, info = await service.sessions.open(
            api_key=caller.api_key, model=model, session_id=raw.get("session_id"), ttl_s=ttl,
            messages=messages)
        return JSONResponse(service.sessions.wire(session, info), status_code=201)

    async def get_session(request: Request, caller: Caller) -> Response:
        sessions = svc(request).sessions
        sid = request.path_params["session_id"]
        sessions.check_owner(sid, owner(request))
        info = sessions.manager.info(sid, caller.api_key)
        session = sessions.manager.peek(sid) if info.state.value in ("active", "detached") else None
        body = sessions.wire(session, info)
        if session is not None and request.query_params.get("messages") == "true":
            body["history"] = session.wire_messages()
        return JSONResponse(body)

    async def renew_session(request: Request, caller: Caller) -> Response:
        sessions = svc(request).sessions
        sid = request.path_params["session_id"]
        sessions.check_owner(sid, owner(request))
        raw = await body_of(request)
        raw = raw if isinstance(raw, dict) else {}
        ttl, generation = raw.get("ttl_s"), raw.get("generation")
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, (int, float))):
            raise DuplexError("invalid_value", "ttl_s must be a number", param="ttl_s")
        if generation is not None and (isinstance(generation, bool) or not isinstance(generation, int)):
            raise DuplexError("invalid_value", "generation must be an integer", param="generation")
        sessions.manager.renew(sid, caller.api_key, ttl_s=ttl, generation=generation)
        session, info = sessions.manager.get(sid, caller.api_key)
        return JSONResponse(sessions.wire(session, info))

    async def close_session(request: Request, caller: Caller) -> Response:
        sessions = svc(request).sessions
        sid = request.path_params["session_id"]
        sessions.check_owner(sid, owner(request))
        info = await sessions.manager.close(sid, caller.api_key, "client")
        sessions.forget(sid)
        return JSONResponse(sessions.wire(None, info))

    async def session_generate(request: Request, caller: Caller) -> Response:
        service = svc(request)
        sid = request.path_params["session_id"]
        raw = await body_of(request)
        if not isinstance(raw, dict):
            raise DuplexError("invalid_value", "the body must be a JSON object", param="body")
        stream = raw.pop("stream", True)
        if not isinstance(stream, bool):
            raise DuplexError("invalid_value", "stream must be a boolean", param="stream")
        mode = raw.pop("mode", "append")
        replace_from = raw.pop("replace_from", None)
        if not isinstance(mode, str):
            raise DuplexError("invalid_value", "mode must be a string", param="mode")
        if replace_from is not None and (isinstance(replace_from, bool)
                                         or not isinstance(replace_from, int)):
            raise DuplexError("invalid_value", "replace_from must be an integer", param="replace_from")
        session, _ = service.sessions.get(sid, caller.api_key, owner(request))
        if raw.get("model") is not None and raw["model"] != session.model:
            raise DuplexError("model_mismatch", f"session {sid!r} is bound to model "
                              f"{session.model!r}, not {raw['model']!r}", param="model")
        if raw.get("adapter") is not None:
            raise DuplexError("model_mismatch", f"session {sid!r} is bound to no adapter",
                              param="adapter")
        raw.pop("adapter", None)
        for unsupported in ("reasoning", "parallel_tool_calls", "instructions"):
            if raw.get(unsupported) not in (None, False):
                raise DuplexError("unsupported_option", f"{unsupported} is not supported on "
                                  "session continuations (use /v1/generate)", param=unsupported)
            raw.pop(unsupported, None)
        spec = parse_generate(raw, served_model=session.model, max_tokens_cap=service.max_tokens_cap,
                              model_required=False, messages_required=mode != "replace",
                              owner=service.sessions.instance_id)
        turn = session.begin(TurnRequest(spec.request_id, spec.messages, spec.sampling, spec.tools,
                                         spec.tool_choice, mode, replace_from))
        return await start_turn(request, caller, session, turn, spec.stream_id, spec.deadline_ms,
                                stream)

    async def start_turn(request: Request, caller: Caller, session: AppSession, turn: Any,
                         stream_id: str | None, deadline_ms: int | None, stream: Any) -> Response:
        service = svc(request)
        sessions = service.sessions
        rid = turn.request.request_id
        sessions.manager.pin(session.session_id)  # no expiry mid-turn

        released = False

        async def done() -> None:  # idempotent: the stream may end before it started
            nonlocal released
            if released:
                return
            released = True
            if session.turn is turn:
                session.turn = None
            sessions.manager.unpin(session.session_id)
            await sessions.finished_turn(session)

        try:
            if stream_id is not None:
                target = service.open_stream(stream_id, caller.key_id, rid)
                service.publish(target, turn, service.run(caller.key_id, rid, turn, turn.events(),
                                                          deadline_ms), None, done)
                return follow(target, 1, stream is not False)
            service.reserve(caller.key_id, rid)
        except BaseException:
            await done()
            raise
        events = _after(service.run(caller.key_id, rid, turn, turn.events(), deadline_ms), done)
        if stream is False:
            return answer({"session_id": session.session_id, **await collect(events)})
        return EventStreamResponse(frames(events), {"x-request-id": rid}, on_close=done)

    # ---- streams and requests --------------------------------------------------

    async def lookup(request: Request, caller: Caller) -> Response:
        raw = await body_of(request)
        ids = raw.get("stream_ids") if isinstance(raw, dict) else None
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids) or len(ids) > 256:
            raise DuplexError("invalid_value", "stream_ids must be a list of up to 256 ids",
                              param="stream_ids")
        found = svc(request).streams.lookup(ids, caller.key_id)
        streams = svc(request).streams
        out = []
        for sid, status in found.items():
            entry: dict[str, Any] = {"stream_id": sid, "status": status.value}
            if status.value in ("active", "completed"):
                s = streams.get(sid, caller.key_id)
                entry.update(first_seq=s.first_seq, head_seq=s.head_seq)
            out.append(entry)
        return JSONResponse({"object": "list", "data": out})

    async def get_stream(request: Request, caller: Caller) -> Response:
        target = svc(request).streams.get(request.path_params["stream_id"], caller.key_id)
        cursor = request.query_params.get("from")
        last = request.headers.get("last-event-id")
        try:
            from_seq = int(cursor) if cursor is not None else (int(last) + 1 if last else 1)
        except ValueError:
            raise DuplexError("invalid_value", "from must be an integer seq", param="from") from None
        return follow(target, from_seq)

    async def delete_stream(request: Request, caller: Caller) -> Response:
        sid = request.path_params["stream_id"]
        before = await svc(request).streams.delete(sid, caller.key_id)
        return JSONResponse({"stream_id": sid, "deleted": True, "status_before": before.value})

    async def control_stream(request: Request, caller: Caller) -> Response:
        service = svc(request)
        sid = request.path_params["stream_id"]
        service.streams.get(sid, caller.key_id)  # 404 before anything else
        changes = parse_control(await body_of(request), service.max_tokens_cap)
        seq = await service.control(sid, caller.key_id, changes)
        return JSONResponse({"stream_id": sid, "applied": changes, "applied_at_seq": seq})

    async def abort_request(request: Request, caller: Caller) -> Response:
        rid = request.path_params["request_id"]
        await svc(request).abort(caller.key_id, rid)
        return JSONResponse({"request_id": rid, "aborted": True})

    return [
        Route("/v1/generate", endpoint(generate), methods=["POST"]),
        Route("/v1/sessions", endpoint(open_session), methods=["POST"]),
        Route("/v1/sessions/{session_id}", endpoint(get_session), methods=["GET"]),
        Route("/v1/sessions/{session_id}", endpoint(close_session), methods=["DELETE"]),
        Route("/v1/sessions/{session_id}/renew", endpoint(renew_session), methods=["POST"]),
        Route("/v1/sessions/{session_id}/generate", endpoint(session_generate), methods=["POST"]),
        Route("/v1/streams/lookup", endpoint(lookup), methods=["POST"]),
        Route("/v1/streams/{stream_id}", endpoint(get_stream), methods=["GET"]),
        Route("/v1/streams/{stream_id}", endpoint(delete_stream), methods=["DELETE"]),
        Route("/v1/streams/{stream_id}/control", endpoint(control_stream), methods=["POST"]),
        Route("/v1/requests/{request_id}/abort", endpoint(abort_request), methods=["POST"]),
    ]


class _Deferred(Response):
    """A response computed when sent (``stream: false`` on a resumable stream)."""

    def __init__(self, make: Callable[[], Awaitable[Response]]) -> None:
        self._make = make

    async def __call__(self, scope, receive, send) -> None:
        await (await self._make())(scope, receive, send)


async def _after(events: AsyncIterator[TextEvent], done: Callable[[], Awaitable[None]]
                 ) -> AsyncIterator[TextEvent]:
    try:
        async for ev in events:
            yield ev
    finally:
        await events.aclose()  # type: ignore[attr-defined]
        await done()
