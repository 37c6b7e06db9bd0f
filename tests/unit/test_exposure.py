"""A server beyond loopback without API keys is refused unless asked for in
so many words; the start-up line says which keys mode is in force."""

from __future__ import annotations

import pytest
from vllm_duplex.cli import build_parser
from vllm_duplex.host.exposure import is_loopback, keys_line, refusal


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.1.1", "localhost", "::1", "[::1]"])
def test_loopback_addresses_need_no_key(host):
    assert is_loopback(host) and refusal(host, (), False) is None


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.5", "192.168.1.2", "myhost.example"])
def test_an_exposed_bind_without_keys_is_refused_with_both_ways_out(host):
    why = refusal(host, (), False)
    assert why is not None and host in why
    assert "api_keys" in why and "--allow-unauthenticated" in why
    assert refusal(host, ("k1",), False) is None  # keys: fine
    assert refusal(host, (), True) is None  # open on purpose


def test_the_keys_line_names_the_mode():
    assert keys_line("0.0.0.0", ("a", "b")).startswith("API keys: 2 configured")
    assert "loopback" in keys_line("127.0.0.1", ())
    assert "open to anyone who can reach 0.0.0.0" in keys_line("0.0.0.0", ())


def test_serve_takes_allow_unauthenticated():
    parser = build_parser()
    assert parser.parse_args(["serve"]).allow_unauthenticated is False
    assert parser.parse_args(["serve", "--allow-unauthenticated"]).allow_unauthenticated is True
