"""HTTP routes of the text surfaces (a thin shell over ``TextService``).

- ``POST /v1/generate``                     stateless single step (SSE; ``stream: false`` → JSON)
- ``POST /v1/sessions`` · ``GET|DELETE /v1/sessions/{id}`` · ``POST …/renew``
- ``POST /v1/sessions/{id}/generate``       continue an application session
- ``POST /v1/streams/lookup`` · ``GET|DELETE /v1/streams/{id}`` · ``POST …/control``
- ``POST /v1/requests/{request_id}/abort``

Errors are ``{"error": {...}}`` with the status of ``vllm_duplex.domain.errors``.
Every id is scoped to the API key that made it: any other key gets 404.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from vllm_duplex.domain.errors import ERRORS, DuplexError
from vllm_duplex.realtime.server.sse import EventStreamResponse, sse_frame
from vllm_duplex.text.app_sessions import AppSession
from vllm_duplex.text import continuation as sessions_api
from vllm_duplex.text.continuation import SessionTurn, begin_continuation
from vllm_duplex.text.events import ErrorEvent, TextEvent, collect, from_wire
from vllm_duplex.text.requests import parse_control, parse_generate
from vllm_duplex.realtime.server.http_errors import error_response

if TYPE_CHECKING:
    from vllm_duplex.text.service import TextService

OWNER_HEADER = "duplex-owner-instance"
Handler = Callable[[Request, "Caller"], Awaitable[Response]]


class Caller:
    """Who is asking: the API key (checked) and its owner id (HMAC)."""

    def __init__(self, api_key: str | None, key_id: str | None) -> None:
        self.api_key = api_key
        self.key_id = key_id


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
        if spec.stream_id is not None:
            control = spec.control()
            run = service.generator.start(spec, control)
            target = await service.open_stream(spec.stream_id, caller.key_id, spec.request_id,
                                               caller.api_key)
            service.publish(target, run, service.run(caller.key_id, spec.request_id, run,
                                                     run.events(), spec.deadline_ms), control)
            return follow(target, 1, stream)
        events = service.generate(spec, caller.key_id)
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
        body = await sessions_api.open_session(svc(request), await body_of(request), caller.api_key)
        return JSONResponse(body, status_code=201)

    async def get_session(request: Request, caller: Caller) -> Response:
        return JSONResponse(await sessions_api.describe_session(
            svc(request), request.path_params["session_id"], caller.api_key, owner(request),
            history=request.query_params.get("messages") == "true"))

    async def renew_session(request: Request, caller: Caller) -> Response:
        return JSONResponse(await sessions_api.renew_session(
            svc(request), request.path_params["session_id"], await body_of(request),
            caller.api_key, owner(request)))

    async def close_session(request: Request, caller: Caller) -> Response:
        return JSONResponse(await sessions_api.close_session(
            svc(request), request.path_params["session_id"], caller.api_key, owner(request)))

    async def session_generate(request: Request, caller: Caller) -> Response:
        service = svc(request)
        cont = await begin_continuation(service, request.path_params["session_id"],
                                        await body_of(request), caller.api_key, owner(request))
        return await start_turn(request, caller, cont.session, cont.turn, cont.spec.stream_id,
                                cont.spec.deadline_ms, cont.stream)

    async def start_turn(request: Request, caller: Caller, session: AppSession, turn: Any,
                         stream_id: str | None, deadline_ms: int | None, stream: Any) -> Response:
        service = svc(request)
        rid = turn.request.request_id
        hold = SessionTurn(service, session, turn)
        try:
            if stream_id is not None:
                target = await service.open_stream(stream_id, caller.key_id, rid, caller.api_key)
                service.publish(target, turn, service.run(caller.key_id, rid, turn, turn.events(),
                                                          deadline_ms), None, hold.release)
                return follow(target, 1, stream is not False)
            service.reserve(caller.key_id, rid)
        except BaseException:
            await hold.release()
            raise
        events = hold.events(caller.key_id, deadline_ms)
        if stream is False:
            return answer({"session_id": session.session_id, **await collect(events)})
        return EventStreamResponse(frames(events), {"x-request-id": rid}, on_close=hold.release)

    # ---- streams and requests --------------------------------------------------

    async def lookup(request: Request, caller: Caller) -> Response:
        raw = await body_of(request)
        ids = raw.get("stream_ids") if isinstance(raw, dict) else None
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids) or len(ids) > 256:
            raise DuplexError("invalid_value", "stream_ids must be a list of up to 256 ids",
                              param="stream_ids")
        streams = svc(request).streams
        # With a durable store, ids not here are looked up there (taken over
        # when their owner is gone; a live owner elsewhere is named).
        elsewhere = await streams.reach(ids, caller.api_key, caller.key_id)
        found = streams.lookup(ids, caller.key_id)
        out = []
        for sid, status in found.items():
            entry: dict[str, Any] = {"stream_id": sid, "status": status.value}
            owner = elsewhere[sid].details.get("owner_instance_id") if sid in elsewhere else None
            if owner is not None and status.value == "unknown":
                entry["owner_instance_id"] = owner
            if status.value in ("active", "completed"):
                s = streams.get(sid, caller.key_id)
                entry.update(first_seq=s.first_seq, head_seq=s.head_seq)
            out.append(entry)
        return JSONResponse({"object": "list", "data": out})

    async def reached(request: Request, caller: Caller) -> str:
        """The path's stream id, taken over first when it is kept elsewhere and
        its owner is gone (a durable store); ``wrong_instance`` when it lives."""
        sid = request.path_params["stream_id"]
        for err in (await svc(request).streams.reach([sid], caller.api_key, caller.key_id)).values():
            raise err
        return sid

    async def get_stream(request: Request, caller: Caller) -> Response:
        target = svc(request).streams.get(await reached(request, caller), caller.key_id)
        cursor = request.query_params.get("from")
        last = request.headers.get("last-event-id")
        try:
            from_seq = int(cursor) if cursor is not None else (int(last) + 1 if last else 1)
        except ValueError:
            raise DuplexError("invalid_value", "from must be an integer seq", param="from") from None
        return follow(target, from_seq)

    async def delete_stream(request: Request, caller: Caller) -> Response:
        sid = await reached(request, caller)
        before = await svc(request).streams.delete(sid, caller.key_id)
        return JSONResponse({"stream_id": sid, "deleted": True, "status_before": before.value})

    async def control_stream(request: Request, caller: Caller) -> Response:
        service = svc(request)
        sid = await reached(request, caller)
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
