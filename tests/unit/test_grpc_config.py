"""``server.grpc_port`` in a deployment config and ``serve --grpc-port``: off when unset."""

from __future__ import annotations

from vllm_duplex.host.deploy import DeployConfig
from vllm_duplex.cli import build_parser

BASE = {"name": "t", "model": "m", "policy": "scripted"}


def test_grpc_port_is_off_unless_configured():
    assert DeployConfig.from_dict(BASE).grpc_port is None
    assert DeployConfig.from_dict({**BASE, "server": {"grpc_port": 50051}}).grpc_port == 50051


def test_serve_takes_a_grpc_port():
    parser = build_parser()
    assert parser.parse_args(["serve"]).grpc_port is None
    assert parser.parse_args(["serve", "--grpc-port", "50052"]).grpc_port == 50052
