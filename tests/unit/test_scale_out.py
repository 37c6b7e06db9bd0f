"""The sans-I/O parts of scale-out: owner ids, the workers topology, the
fleet's health and metrics merge, and the router config's id rules."""

from __future__ import annotations

import re

import pytest
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.owner_ids import check_routed_id, mint, owner_of
from vllm_duplex.host.deploy import DeployConfig
from vllm_duplex.fleet.view import WorkerStatus, fleet_health, merge_metrics
from vllm_duplex.fleet.router import MINTED_ID_REGEX, RouterPlan, nginx_conf
from vllm_duplex.host.topology import Workers

# The router's regex, read the way Python reads it: the two must agree.
ROUTER_ID = re.compile(MINTED_ID_REGEX.replace("(?<", "(?P<").replace(r"\z", r"\Z"))


def router_owner(any_id: str) -> str | None:
    m = ROUTER_ID.match(any_id)
    return m.group("duplex_cap") if m else None


@pytest.mark.parametrize("kind,owner", [("sess", "w1"), ("gen", "m2w3"), ("sess", "A9")])
def test_a_minted_id_names_its_owner_for_the_server_and_the_router(kind, owner):
    ids = {mint(kind, owner) for _ in range(50)}
    assert len(ids) == 50
    for i in ids:
        assert owner_of(i) == owner == router_owner(i)
        assert re.fullmatch(r"[A-Za-z0-9._:-]{1,128}", i)  # a valid session id everywhere


@pytest.mark.parametrize("any_id", [
    "sess_abc.w1",  # token too short: not minted
    "my.own.id.w1", "sess_abcdefghijklmnopqrstuvwx.inst_x1",  # owner part not routable
    "sess_abcdefghijklmnopqrstuvwx.w-1", "sess_abcdefghijklmnopqrstuvwx.", "sess_" + "a" * 24,
    "SESS_abcdefghijklmnopqrstuvwx.w1", "sess_abcdefghijklmnopqrstuvwx.w1\n",
])
def test_other_ids_name_no_owner_for_either(any_id):
    assert owner_of(any_id) is None and router_owner(any_id) is None


def test_an_unroutable_instance_still_mints_ids_that_no_router_follows():
    sid = mint("sess", "inst_Ab-c")
    assert sid.endswith(".inst_Ab-c") and owner_of(sid) is None
    with pytest.raises(ValueError):
        mint("Sess", "w1")


def test_the_id_in_the_url_must_be_the_one_the_request_names():
    check_routed_id(None, "sess_x")  # a direct connection names none
    check_routed_id("sess_x", "sess_x")
    with pytest.raises(DuplexError) as err:
        check_routed_id("sess_y", "sess_x")
    assert err.value.code == "invalid_value" and err.value.param == "session_id"


def test_workers_topology_from_a_count_or_a_mapping():
    assert Workers.from_raw(None) == Workers() and not Workers().configured
    assert Workers.from_raw(3).instance_ids() == ("w1", "w2", "w3")
    m2 = Workers.from_raw({"count": 2, "machine": "m2", "spare_engine_slots": 1})
    assert m2.instance_ids() == ("m2w1", "m2w2") and m2.spare_slots == 1
    assert Workers.from_raw(2).spare_slots == 4  # default: 2 restarts per worker
    assert Workers.from_raw({"count": 2, "ids": ["east", "west"]}).instance_ids() == ("east", "west")
    assert Workers.from_raw({"count": 2, "machine": "m2"}).with_count(3).instance_ids() == (
        "m2w1", "m2w2", "m2w3")
    config = DeployConfig.from_dict({"name": "x", "model": "m", "policy": "scripted",
                                     "workers": {"count": 2, "machine": "m7"}})
    assert config.workers.instance_ids() == ("m7w1", "m7w2")


@pytest.mark.parametrize("raw", [0, True, "2", {"count": 2, "ids": ["a"]},
                                 {"count": 2, "ids": ["a", "a"]}, {"count": 1, "ids": ["w_1"]},
                                 {"count": 1, "machine": "m2w3"}, {"count": 1, "machine": "mx"},
                                 {"count": 2, "ports": [1, 1]}, {"count": 1, "bogus": 1},
                                 {"count": 1, "spare_engine_slots": -1}])
def test_a_bad_workers_config_fails_loudly(raw):
    with pytest.raises(ValueError):
        Workers.from_raw(raw)


WORKER_TEXT = """# HELP duplex_sessions_live Live sessions
# TYPE duplex_sessions_live gauge
duplex_sessions_live 2
# HELP duplex_errors_total Error events sent, by code
# TYPE duplex_errors_total counter
duplex_errors_total{code="invalid_json"} 1
# HELP duplex_ingest_latency_seconds Frame received -> stage submit
# TYPE duplex_ingest_latency_seconds summary
duplex_ingest_latency_seconds{quantile="0.5"} 0.001
duplex_ingest_latency_seconds_sum 0.5
duplex_ingest_latency_seconds_count 10
"""


def test_merged_metrics_label_every_series_by_worker_and_declare_each_family_once():
    text = merge_metrics({"w1": WORKER_TEXT, "w2": WORKER_TEXT.replace(" 2\n", " 5\n")})
    lines = text.splitlines()
    assert lines.count("# TYPE duplex_sessions_live gauge") == 1
    assert 'duplex_sessions_live{worker="w1"} 2' in lines
    assert 'duplex_sessions_live{worker="w2"} 5' in lines
    assert 'duplex_errors_total{worker="w2",code="invalid_json"} 1' in lines
    assert 'duplex_ingest_latency_seconds_count{worker="w1"} 10' in lines
    assert not [x for x in lines if not x.startswith("#") and 'worker="' not in x]
    # each family's samples directly follow its own TYPE line
    i = lines.index("# TYPE duplex_ingest_latency_seconds summary")
    assert all(x.startswith("duplex_ingest_latency_seconds") for x in lines[i + 1:])


def _status(wid: str, state: str = "up") -> WorkerStatus:
    return WorkerStatus(wid, f"127.0.0.1:{len(wid)}", state, 1, 0, 1)


@pytest.mark.parametrize("states,answers,status,code", [
    (("up", "up"), ("ok", "ok"), "ok", 200),
    (("up", "restarting"), ("ok", None), "degraded", 200),
    (("up", "up"), ("ok", "unhealthy"), "degraded", 200),
    (("restarting", "failed"), (None, None), "unhealthy", 503),
])
def test_fleet_health_serves_while_any_worker_does(states, answers, status, code):
    workers = [_status("w1", states[0]), _status("w2", states[1])]
    got = {w.instance_id: ({"status": a, "sessions": 3} if a else None)
           for w, a in zip(workers, answers)}
    body, http = fleet_health(workers, got, None)
    assert (body["status"], http) == (status, code)
    assert body["sessions"] == 3 * sum(1 for a in answers if a)


def test_fleet_health_is_unhealthy_without_its_engine_core():
    workers = [_status("w1")]
    body, http = fleet_health(workers, {"w1": {"status": "ok"}}, {"alive": False})
    assert (body["status"], http) == ("unhealthy", 503)


def test_router_config_maps_each_owner_to_its_own_upstream(tmp_path):
    plan = RouterPlan.for_workers("127.0.0.1:8000", {"w1": "127.0.0.1:8101",
                                                     "w2": "127.0.0.1:8102"},
                                  max_request_bytes=4096, fleet="127.0.0.1:8199")
    conf = nginx_conf(plan, tmp_path)
    assert "w1 duplex_w1;" in conf and "w2 duplex_w2;" in conf
    assert "upstream duplex_w1 { server 127.0.0.1:8101 max_fails=0; keepalive 16; }" in conf
    assert "client_max_body_size 4096;" in conf and "least_conn;" in conf
    with pytest.raises(ValueError):
        RouterPlan.for_workers("127.0.0.1:8000", {"w_1": "127.0.0.1:1"}, max_request_bytes=1,
                               fleet=None)
    edge = nginx_conf(RouterPlan.for_edge("127.0.0.1:9000", {"m2": "10.0.0.2:8000"},
                                          max_request_bytes=4096), tmp_path)
    assert "~^m2w[0-9]+$ duplex_m2;" in edge


def test_with_a_durable_store_a_resume_tries_the_other_workers_only_when_its_owner_is_down(
        tmp_path):
    workers = {"w1": "127.0.0.1:8101", "w2": "127.0.0.1:8102", "w3": "127.0.0.1:8103"}
    plain = nginx_conf(RouterPlan.for_workers("127.0.0.1:8000", workers, max_request_bytes=1,
                                              fleet=None), tmp_path)
    assert "backup" not in plain
    conf = nginx_conf(RouterPlan.for_workers("127.0.0.1:8000", workers, max_request_bytes=1,
                                             fleet=None, adopt=True), tmp_path)
    # backup servers: nginx tries them only when the owner does not answer at all
    assert ("upstream duplex_w2 { server 127.0.0.1:8102 max_fails=0; "
            "server 127.0.0.1:8101 backup max_fails=0; server 127.0.0.1:8103 backup "
            "max_fails=0; keepalive 16; }") in conf
    # a resume may name the worker that adopted the session (&owner=)
    assert '"~^(1|true):(?<duplex_adopter>[A-Za-z0-9]{1,32})$" $duplex_adopter;' in conf


def test_fleet_health_says_when_durability_is_degraded():
    workers = [_status("w1"), _status("w2")]
    ok = {"status": "ok", "durability": {"durable": True, "state": "ok"}}
    bad = {"status": "ok", "durability": {"durable": True, "state": "degraded"}}
    assert fleet_health(workers, {"w1": ok, "w2": ok}, None)[0]["durability"] == "ok"
    body, http = fleet_health(workers, {"w1": ok, "w2": bad}, None)
    assert (body["durability"], body["status"], http) == ("degraded", "ok", 200)
    assert fleet_health(workers, {"w1": {"status": "ok"}}, None)[0]["durability"] == "off"
