"""A small async client for the OpenEngine gRPC surface (``docs/api.md``, gRPC).

    async with OpenEngineClient("127.0.0.1:50051", api_key="...") as client:
        session = await client.open_session(MODEL)
        result = await client.generate(messages=[{"role": "user", "content": "Hi"}],
                                       session=session.ref, max_tokens=24)
        async with client.stream(model=MODEL) as stream:      # streaming input
            await stream.input("What is the capital ")
            await stream.input("of France?")
            result = await stream.end()                        # the collected answer

Failures are ``OpenEngineError`` (``status``: the gRPC code; ``code``,
``param``, ``retryable`` and ``metadata`` from the ``google.rpc.ErrorInfo``
of the rich status).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from vllm_duplex.realtime.wire.openengine.v1 import engine_pb2 as e
from vllm_duplex.realtime.wire.openengine.v1 import engine_pb2_grpc, sessions_pb2_grpc
from vllm_duplex.realtime.wire.openengine.v1 import sessions_pb2 as s
from vllm_duplex.realtime.wire.openengine.v1 import types_pb2 as t


class OpenEngineError(Exception):
    def __init__(self, err: grpc.aio.AioRpcError) -> None:
        super().__init__(f"{err.code().name}: {err.details()}")
        self.status = err.code()
        self.message = err.details()
        self.metadata: dict[str, str] = {}
        self.reason = ""
        status = rpc_status.from_call(err)
        for detail in status.details if status is not None else ():
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                self.reason, self.metadata = info.reason, dict(info.metadata)
        self.code = self.metadata.get("code", "")
        self.param = self.metadata.get("param")
        self.retryable = self.metadata.get("retryable") == "true"


def messages(raw: Iterable[Mapping[str, Any]]) -> list[t.Message]:
    """Chat messages as dicts (``role``, ``content``) -> protobuf."""
    return [t.Message(role=m["role"], content=m.get("content") or "") for m in raw]


def request(*, model: str | None = None, messages_: Iterable[Mapping[str, Any]] = (),
            session: t.GenerationSessionRef | str | None = None, max_tokens: int | None = None,
            request_id: str | None = None, **options: Any) -> e.GenerateRequest:
    if isinstance(session, str):
        session = t.GenerationSessionRef(session_id=session)
    return e.GenerateRequest(model=model or "", request_id=request_id, messages=messages(messages_),
                             session=session,
                             options=t.GenerationOptions(max_tokens=max_tokens, **options))


class OpenEngineClient:
    def __init__(self, target: str, api_key: str | None = None, owner: str | None = None) -> None:
        self.channel = grpc.aio.insecure_channel(target)
        self.metadata: tuple[tuple[str, str], ...] = ()
        if api_key is not None:
            self.metadata += (("authorization", f"Bearer {api_key}"),)
        if owner is not None:
            self.metadata += (("duplex-owner-instance", owner),)
        self.sessions = sessions_pb2_grpc.OpenEngineSessionsStub(self.channel)
        self.engine = engine_pb2_grpc.OpenEngineStub(self.channel)
        self.streaming = engine_pb2_grpc.OpenEngineStreamingStub(self.channel)

    async def __aenter__(self) -> OpenEngineClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        await self.channel.close()

    async def _call(self, method: Any, req: Any, timeout: float | None = None) -> Any:
        try:
            return await method(req, metadata=self.metadata, timeout=timeout)
        except grpc.aio.AioRpcError as err:
            raise OpenEngineError(err) from None

    async def open_session(self, model: str, *, session_id: str | None = None,
                           ttl_s: float | None = None, instructions: str | None = None,
                           history: Iterable[Mapping[str, Any]] = ()) -> s.GenerationSession:
        return await self._call(self.sessions.OpenGenerationSession, s.OpenGenerationSessionRequest(
            model=model, session_id=session_id, ttl_s=ttl_s, instructions=instructions,
            messages=messages(history)))

    async def get_session(self, ref: t.GenerationSessionRef, history: bool = False):
        return await self._call(self.sessions.GetGenerationSession,
                                s.GetGenerationSessionRequest(ref=ref, include_history=history))

    async def renew_session(self, ref: t.GenerationSessionRef, ttl_s: float | None = None,
                            generation: int | None = None) -> s.GenerationSession:
        return await self._call(self.sessions.RenewGenerationSession, s.RenewGenerationSessionRequest(
            ref=ref, ttl_s=ttl_s, generation=generation))

    async def close_session(self, ref: t.GenerationSessionRef) -> s.GenerationSession:
        answer = await self._call(self.sessions.CloseGenerationSession,
                                  s.CloseGenerationSessionRequest(ref=ref))
        return answer.session

    async def generate(self, *, model: str | None = None,
                       messages: Iterable[Mapping[str, Any]] = (),
                       session: t.GenerationSessionRef | str | None = None,
                       timeout: float | None = None, **options: Any) -> e.GenerateResult:
        """Stateless, or a continuation of ``session`` (append)."""
        return await self._call(self.engine.Generate,
                                request(model=model, messages_=messages, session=session, **options),
                                timeout)

    async def abort(self, request_id: str) -> e.AbortResponse:
        return await self._call(self.engine.Abort, e.AbortRequest(request_id=request_id))

    async def capabilities(self) -> e.Capabilities:
        return await self._call(self.engine.GetCapabilities, e.GetCapabilitiesRequest())

    def stream(self, *, model: str | None = None, session: t.GenerationSessionRef | str | None = None,
               timeout: float | None = None, **options: Any) -> InputStream:
        return InputStream(self, request(model=model, session=session, **options), timeout)


class InputStream:
    """One ``GenerateStream``: ``input`` chunks (numbered here), then ``end``."""

    def __init__(self, client: OpenEngineClient, start: e.GenerateRequest, timeout: float | None) -> None:
        self.client = client
        self.start = start
        self.timeout = timeout
        self.next_seq = 1
        self.call: Any = None
        self.started: e.Started | None = None

    async def __aenter__(self) -> InputStream:
        self.call = self.client.streaming.GenerateStream(metadata=self.client.metadata,
                                                         timeout=self.timeout)
        await self.send(e.GenerateStreamRequest(start=self.start))
        first = await self.receive()
        if first.WhichOneof("event") == "error":  # refused: nothing started
            self.call.cancel()
            raise OpenEngineStreamError(first.error)
        self.started = first.started
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self.call is not None and not self.call.done():
            self.call.cancel()

    async def send(self, req: e.GenerateStreamRequest) -> None:
        await self.call.write(req)

    async def receive(self) -> e.GenerateResponse:
        try:
            got = await self.call.read()
        except grpc.aio.AioRpcError as err:
            raise OpenEngineError(err) from None
        if got is grpc.aio.EOF:
            raise EOFError("the stream ended")
        return got

    async def input(self, text: str) -> e.Ack:
        """One chunk; its ack (a non-terminal error raises ``OpenEngineStreamError``)."""
        await self.send(e.GenerateStreamRequest(input=e.InputChunk(seq=self.next_seq, text=text)))
        self.next_seq += 1
        got = await self.receive()
        if got.WhichOneof("event") == "error":
            raise OpenEngineStreamError(got.error)
        return got.ack

    async def events(self) -> AsyncIterator[e.GenerateResponse]:
        while True:
            got = await self.receive()
            yield got
            if got.WhichOneof("event") == "finish":
                return

    async def end(self) -> e.GenerateResult:
        """End-of-input; the whole answer."""
        await self.send(e.GenerateStreamRequest(end=e.EndOfInput(last_seq=self.next_seq - 1)))
        await self.call.done_writing()
        text = []
        async for got in self.events():
            kind = got.WhichOneof("event")
            if kind == "text_delta":
                text.append(got.text_delta.delta)
            elif kind == "finish":
                f = got.finish
                return e.GenerateResult(request_id=f.request_id, text="".join(text),
                                        finish_reason=f.finish_reason, usage=f.usage)
        raise EOFError("the stream ended without finish")

    async def cancel(self, close_session: bool = False) -> e.Finish:
        """Stop the generation; its terminal ``finish`` (``cancelled``, or how it ended)."""
        await self.send(e.GenerateStreamRequest(cancel=e.CancelStream(close_session=close_session)))
        async for got in self.events():
            if got.WhichOneof("event") == "finish":
                return got.finish
        raise EOFError("the stream ended without finish")


class OpenEngineStreamError(Exception):
    """A non-terminal error of a ``GenerateStream`` (the stream goes on)."""

    def __init__(self, error: t.Error) -> None:
        super().__init__(f"{error.code}: {error.message}")
        self.code = error.code
        self.param = error.param
        self.error = error
