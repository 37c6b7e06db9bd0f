"""``sip:`` in a deployment config (plugin/host/sip.py): what it takes and
what it refuses at start-up."""

from __future__ import annotations

import pytest
from vllm_duplex.host.deploy import DeployConfig
from vllm_duplex.host.sip import Sip

BASE = {"name": "t", "model": "m", "policy": "scripted", "stages": []}


def test_no_section_means_no_sip():
    assert DeployConfig.from_dict(BASE).sip is None


def test_a_section_is_read_with_its_defaults(monkeypatch):
    monkeypatch.delenv("VLLM_DUPLEX_SIP_WEBHOOK_SECRET", raising=False)
    sip = DeployConfig.from_dict({**BASE, "sip": {"host": "0.0.0.0", "webhook_url": "https://a/b",
                                                  "webhook_secret": "whsec_abc="}}).sip
    assert sip is not None and sip.port == 5060 and sip.transports == ("udp", "tcp")
    assert sip.advertised_address == "127.0.0.1"  # 0.0.0.0 is no address to give a caller
    assert Sip.from_raw({"accept": {}, "media_address": "203.0.113.7"}).advertised_address \
        == "203.0.113.7"


def test_the_secret_may_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("VLLM_DUPLEX_SIP_WEBHOOK_SECRET", "whsec_env=")
    assert Sip.from_raw({"webhook_url": "https://a/b", "webhook_secret": "whsec_file="}
                        ).webhook_secret == "whsec_env="


@pytest.mark.parametrize("raw, why", [
    ({"webhook_url": "https://a/b", "prot": 5060}, "unknown sip keys"),
    ({"port": 5060}, "webhook_url"),  # calls would ring no one
    ({"webhook_url": "https://a/b", "transports": ["tls"]}, "transports"),
    ({"webhook_url": "https://a/b", "webhook_secret": "hunter2"}, "whsec_"),
    ({"accept": "yes"}, "session object"),
    ({"accept": {}, "tls_port": 5061}, "tls_certfile"),
])
def test_mistakes_fail_at_start(raw, why, monkeypatch):
    monkeypatch.delenv("VLLM_DUPLEX_SIP_WEBHOOK_SECRET", raising=False)
    with pytest.raises(ValueError, match=why):
        DeployConfig.from_dict({**BASE, "sip": raw})
