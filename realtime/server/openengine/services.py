"""The servicers of the OpenEngine gRPC surface: each method reads its
message into the body the shared code of ``vllm_duplex.text`` takes, calls
it, and writes the answer back (``convert``); every ``DuplexError`` becomes
the status of the one error table (``status``).

Auth is the HTTP surfaces': ``authorization: Bearer <key>`` metadata, checked
against the same keys, and every id is scoped to the key (another key's
session is NOT_FOUND). ``duplex-owner-instance`` metadata, or the ref's
``owner_instance_id``, claims an owner, as the HTTP header does.

Cancellation, a gRPC deadline and a disconnect all cancel the handler task:
the shared generators' cleanup then aborts the vLLM request (as an HTTP
disconnect does), and a session the call continued stays open.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf import descriptor_pool, message_factory
from google.protobuf.message import DecodeError
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.host.sessions import check_api_key
from vllm_duplex.realtime.server.auth import bearer_key
from vllm_duplex.realtime.server.openengine import convert
from vllm_duplex.realtime.server.openengine.status import abort
from vllm_duplex.realtime.wire.openengine.v1 import engine_pb2 as e
from vllm_duplex.realtime.wire.openengine.v1 import engine_pb2_grpc, sessions_pb2_grpc
from vllm_duplex.realtime.wire.openengine.v1 import sessions_pb2 as s
from vllm_duplex.text import continuation as sessions_api
from vllm_duplex.text.continuation import SessionTurn, begin_continuation
from vllm_duplex.text.events import collect, from_wire
from vllm_duplex.text.input_stream import StreamingInput
from vllm_duplex.text.requests import parse_generate

if TYPE_CHECKING:
    from vllm_duplex.host.runtime import Runtime
    from vllm_duplex.text.service import TextService

log = logging.getLogger(__name__)

OWNER_KEY = "duplex-owner-instance"


def _internal() -> DuplexError:
    return DuplexError("internal_error", "the server failed on this request")


class Call:
    """Who is asking, and on which service (raises the typed error)."""

    def __init__(self, runtime: Runtime, context: grpc.aio.ServicerContext) -> None:
        meta = {k.lower(): v for k, v in (context.invocation_metadata() or ())
                if isinstance(v, str)}
        self.api_key = bearer_key(meta)
        check_api_key(runtime.config.api_keys, runtime.client_secrets, self.api_key)
        service = runtime.text
        if service is None:
            raise DuplexError("capability_unsupported", "this deployment has no vLLM text stage")
        self.service: TextService = service
        self.key_id = service.key_id(self.api_key)
        self.owner = meta.get(OWNER_KEY) or None


class Undecodable:
    """A request whose bytes are not its message: answered ``invalid_event``
    by the method (typed, like every other bad input), not by grpc's INTERNAL."""


UNDECODABLE = Undecodable()
def _not_decoded() -> DuplexError:
    return DuplexError("invalid_event", "the request does not decode as its protobuf message")


def _decoder(cls: Any) -> Callable[[bytes], Any]:
    def decode(data: bytes) -> Any:
        try:
            return cls.FromString(data)
        except (DecodeError, RuntimeError, ValueError):
            return UNDECODABLE
    return decode


def register(server: grpc.aio.Server, service_name: str, servicer: Any) -> None:
    """Add ``servicer``'s methods of ``service_name`` (the generated
    ``add_*_to_server``, but with decoders that never fail the call untyped)."""
    service = descriptor_pool.Default().FindServiceByName(service_name)
    handlers = {}
    for method in service.methods:
        decode = _decoder(message_factory.GetMessageClass(method.input_type))
        encode = message_factory.GetMessageClass(method.output_type).SerializeToString
        fn = getattr(servicer, method.name)
        if method.client_streaming and method.server_streaming:
            handler = grpc.stream_stream_rpc_method_handler(fn, decode, encode)
        else:
            handler = grpc.unary_unary_rpc_method_handler(fn, decode, encode)
        handlers[method.name] = handler
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service_name, handlers),))
    server.add_registered_method_handlers(service_name, handlers)


def _ref(ref: Any) -> tuple[str, str | None]:
    """A ``GenerationSessionRef`` -> (session id, claimed owner)."""
    return ref.session_id, ref.owner_instance_id or None


def typed(method: Callable) -> Callable:
    """A unary method whose ``DuplexError`` is answered as its status."""
    async def run(self, request, context):
        try:
            call = Call(self.runtime, context)
            if request is UNDECODABLE:
                raise _not_decoded()
            return await method(self, call, request)
        except DuplexError as err:
            await abort(context, err)
        except Exception:  # a bug is still a typed status, and the server goes on
            log.exception("gRPC %s failed", method.__name__)
            await abort(context, _internal())
    run.__name__ = method.__name__
    return run


class Sessions(sessions_pb2_grpc.OpenEngineSessionsServicer):
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    @typed
    async def OpenGenerationSession(self, call: Call, req: s.OpenGenerationSessionRequest):
        return convert.session(await sessions_api.open_session(call.service, convert.to_body(req),
                                                               call.api_key))

    @typed
    async def GetGenerationSession(self, call: Call, req: s.GetGenerationSessionRequest):
        sid, owner = _ref(req.ref)
        return convert.session(await sessions_api.describe_session(
            call.service, sid, call.api_key, owner or call.owner, history=req.include_history))

    @typed
    async def RenewGenerationSession(self, call: Call, req: s.RenewGenerationSessionRequest):
        sid, owner = _ref(req.ref)
        body = convert.to_body(req)
        body.pop("ref", None)
        return convert.session(await sessions_api.renew_session(call.service, sid, body, call.api_key,
                                                                owner or call.owner))

    @typed
    async def CloseGenerationSession(self, call: Call, req: s.CloseGenerationSessionRequest):
        sid, owner = _ref(req.ref)
        doc = await sessions_api.close_session(call.service, sid, call.api_key, owner or call.owner)
        return s.CloseGenerationSessionResponse(session=convert.session(doc))


class Engine(engine_pb2_grpc.OpenEngineServicer):
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    @typed
    async def Generate(self, call: Call, req: e.GenerateRequest):
        service = call.service
        body, sid, owner = convert.generate_body(req)
        if sid is None:  # stateless
            spec = parse_generate(body, served_model=service.model,
                                  max_tokens_cap=service.max_tokens_cap,
                                  owner=service.sessions.instance_id)
            events = service.generate(spec, call.key_id)
        else:
            cont = await begin_continuation(service, sid, body, call.api_key, owner or call.owner)
            hold = SessionTurn(service, cont.session, cont.turn)
            try:
                service.reserve(call.key_id, cont.spec.request_id)
            except BaseException:
                await hold.release()
                raise
            events = hold.events(call.key_id, cont.spec.deadline_ms)
        answer = await collect(events)
        if "error" in answer:
            failed = from_wire("error", answer)
            raise failed.error
        return convert.result(answer, sid)

    @typed
    async def Abort(self, call: Call, req: e.AbortRequest):
        await call.service.abort(call.key_id, req.request_id)
        return e.AbortResponse(request_id=req.request_id, aborted=True)

    @typed
    async def GetCapabilities(self, call: Call, req: e.GetCapabilitiesRequest):
        return convert.capabilities(self.runtime.capabilities(), self.runtime.model)


_CLOSED = object()
_FAILED = object()


class Streaming(engine_pb2_grpc.OpenEngineStreamingServicer):
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    async def GenerateStream(self, requests: AsyncIterator[e.GenerateStreamRequest],
                             context: grpc.aio.ServicerContext) -> AsyncIterator[e.GenerateResponse]:
        try:
            call = Call(self.runtime, context)
        except DuplexError as err:
            await abort(context, err)
            return
        out: asyncio.Queue[Any] = asyncio.Queue()

        async def closed() -> None:
            out.put_nowait(_CLOSED)

        core = StreamingInput(call.service, call.api_key, call.owner, out.put, closed)

        async def read() -> None:
            ended = False
            async for req in requests:
                if req is UNDECODABLE:
                    await core.error(_not_decoded())
                    continue
                frame, owner = convert.stream_frame(req)
                if owner is not None:
                    core.owner = owner
                try:
                    await core.handle(frame)
                    ended = ended or (frame["type"] == "end" and core.sequence.ended)
                except DuplexError as err:
                    await core.error(err)
                if core.terminal_sent:
                    return
            if not ended and not core.terminal_sent:  # half-closed before end-of-input
                await core.error(DuplexError("invalid_event", "the request stream ended before "
                                             "end-of-input (send end, or cancel)", param="end"),
                                 terminal=True)
                out.put_nowait(_CLOSED)

        def read_done(task: asyncio.Task[None]) -> None:
            if task.cancelled():
                return
            if task.exception() is not None:
                log.error("GenerateStream reader failed", exc_info=task.exception())
                out.put_nowait(_FAILED)
            elif core.terminal_sent:
                out.put_nowait(_CLOSED)

        reader = asyncio.create_task(read(), name="duplex-grpc-stream-reader")
        reader.add_done_callback(read_done)
        terminal: DuplexError | None = None
        try:
            while True:
                frame = await out.get()
                if frame is _CLOSED:
                    break
                if frame is _FAILED:
                    terminal = _internal()
                    break
                if frame["type"] == "error" and frame.get("terminal"):
                    terminal = from_wire("error", frame).error
                    break
                if frame["type"] == "finish":
                    await core.finish()  # the session is free before the client hears the end
                    yield convert.response(frame)
                    break
                yield convert.response(frame)
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            await core.finish()
        if terminal is not None:
            await abort(context, terminal)
