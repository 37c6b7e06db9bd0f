"""The gRPC examples of docs/api.md run as written: the Python one with the
client, and the grpcurl lines with a Python stand-in for grpcurl (grpcurl
itself is not installable here): each method is resolved over server
reflection, the ``-d`` JSON read into its request message, the call made
with the ``-H`` metadata, and the answer printed as JSON."""

from __future__ import annotations

import asyncio
import contextlib
import io
import re
import shlex
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pool, json_format, message_factory
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from support.text_fixtures import KEYS, MODEL
from support.vllm_fixtures import no_leaked_tasks  # noqa: F401

pytestmark = pytest.mark.asyncio(loop_scope="session")

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"
SECTION = DOC.read_text().split("## gRPC: OpenEngine v1", 1)[1].split("\n## ", 1)[0]


def grpcurl(target: str, line: str, api_key: str) -> str:
    """One ``grpcurl -plaintext [-H h] [-d json] $GRPC (list | Service/Method)`` line (blocking)."""
    args = shlex.split(line.replace("$API_KEY", api_key))[1:]
    metadata, body = [], "{}"
    while args[0].startswith("-"):
        flag = args.pop(0)
        if flag == "-H":
            name, value = args.pop(0).split(":", 1)
            metadata.append((name.strip().lower(), value.strip()))
        elif flag == "-d":
            body = args.pop(0)
    assert args[0] == "$GRPC"
    with grpc.insecure_channel(target) as channel:
        db = ProtoReflectionDescriptorDatabase(channel)
        if args[1] == "list":
            return "\n".join(sorted(db.get_services()))
        service, method = args[1].split("/")
        found = descriptor_pool.DescriptorPool(db).FindServiceByName(service).FindMethodByName(method)
        req_cls = message_factory.GetMessageClass(found.input_type)
        resp_cls = message_factory.GetMessageClass(found.output_type)
        call = channel.unary_unary(f"/{service}/{method}", request_serializer=req_cls.SerializeToString,
                                   response_deserializer=resp_cls.FromString)
        answer = call(json_format.Parse(body, req_cls()), metadata=metadata, timeout=120)
        return json_format.MessageToJson(answer)


async def test_the_grpcurl_lines_run_over_reflection(text_server):
    block = re.search(r"```sh\nexport GRPC=.*?\n(.*?)```", SECTION, re.S).group(1)
    lines = [ln for ln in block.splitlines() if ln.startswith("grpcurl")]
    assert len(lines) == 5
    outputs = [await asyncio.to_thread(grpcurl, text_server.grpc_target, ln, KEYS[0]) for ln in lines]
    assert "openengine.v1.OpenEngineStreaming" in outputs[0]
    assert '"sessionId": "doc-grpc-1"' in outputs[1]
    assert '"finishReason"' in outputs[2] and "Paris" in outputs[2]
    assert '"history"' in outputs[3]
    assert '"state": "closed"' in outputs[4]


async def test_the_python_example_runs(text_server):
    block = re.search(r"```python\n(.*?)```", SECTION, re.S).group(1)
    preamble = 'TARGET, API_KEY, MODEL = "127.0.0.1:50051", None, "smollm2-135m-instruct"'
    assert preamble in block
    code = block.replace(preamble, f"TARGET, API_KEY, MODEL = {text_server.grpc_target!r}, "
                                   f"{KEYS[0]!r}, {MODEL!r}")
    code = code.rstrip().removesuffix("asyncio.run(main())")
    namespace: dict = {}
    exec(compile(code, str(DOC), "exec"), namespace)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        await namespace["main"]()
    lines = out.getvalue().splitlines()
    assert "Paris" in lines[0] and lines[0].split()[-1] in ("stop", "length")
    assert lines[1]
    assert lines[2] == "NOT_FOUND session_not_found SESSION_NOT_FOUND"
