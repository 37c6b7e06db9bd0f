"""The checked-in gRPC stubs are what scripts/gen_protos.py makes of the
protos today (a proto edited without regenerating fails here)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gen_protos.py"


def _script():
    spec = importlib.util.spec_from_file_location("gen_protos", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_checked_in_stubs_equal_a_fresh_generation():
    gen = _script()
    fresh = gen.generate()
    current = {p.name: p.read_text() for p in gen.OUT.glob("*_pb2*.py*")}
    assert sorted(current) == sorted(fresh), "stub files differ: run scripts/gen_protos.py"
    for name, text in fresh.items():
        assert current[name] == text, f"{name} is stale: run scripts/gen_protos.py"


def test_the_protocol_package_and_services_are_the_documented_ones():
    from vllm_duplex.realtime.wire.openengine.v1 import engine_pb2, sessions_pb2

    assert sessions_pb2.DESCRIPTOR.package == "openengine.v1"
    services = {**sessions_pb2.DESCRIPTOR.services_by_name, **engine_pb2.DESCRIPTOR.services_by_name}
    assert set(services) == {"OpenEngineSessions", "OpenEngine", "OpenEngineStreaming"}
    stream = services["OpenEngineStreaming"].methods_by_name["GenerateStream"]
    assert stream.client_streaming and stream.server_streaming
    assert set(services["OpenEngineSessions"].methods_by_name) == {
        "OpenGenerationSession", "GetGenerationSession", "RenewGenerationSession",
        "CloseGenerationSession"}
