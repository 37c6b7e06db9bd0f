"""``serve --workers 2`` on the real default config: two workers, ONE vLLM
engine core (issue 13, items 1-2), behind the real nginx.

Both workers answer from the same core (one EngineCore process under the
supervisor; neither worker loads the weights), application sessions and
aborts reach their owner through the router, and a killed worker comes back
on a spare client slot of the same core while the other keeps serving.

A soak test (``-m soak``): one engine core and two workers that join it take
1.5-4.5 minutes to start on 2 shared cores; the suite's routing tests run
the scripted pipeline (test_router.py).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import httpx
import psutil
import pytest
import yaml
from support.router_fixtures import Serve, get_json
from vllm_duplex.host.deploy import resolve_config_path

MODEL = "smollm2-135m-instruct"
FRANCE = [{"role": "system", "content": "You are a helpful assistant. Answer in one short sentence."},
          {"role": "user", "content": "What is the capital of France?"}]  # (text_fixtures.FRANCE: why)
STORY = [{"role": "user", "content": "Tell me a long story about a dragon who learns to fly."}]

pytestmark = pytest.mark.soak


@pytest.fixture(scope="module")
def router():
    raw = yaml.safe_load(resolve_config_path("cascade-cpu").read_text())
    raw["workers"] = {"count": 2, "spare_engine_slots": 1, "restart_backoff_s": 0.2}
    serve = Serve(raw, "serve", ready_timeout_s=600).start(expect_workers=2)
    yield serve
    assert serve.stop() == 0, serve.output()


def post(url: str, body: dict, headers: dict | None = None) -> tuple[int, dict, dict]:
    status, head, answer = get_json(url, {"content-type": "application/json", **(headers or {})},
                                    "POST", json.dumps(body).encode(), timeout=120)
    return status, head, answer


def generate_on(address: str) -> str:
    status, _, answer = post(f"http://{address}/v1/generate",
                             {"model": MODEL, "messages": FRANCE, "stream": False,
                              "options": {"temperature": 0, "max_tokens": 16}})
    assert status == 200, answer
    return answer["output"]["text"]


def test_two_workers_answer_from_one_engine_core(router):
    health = router.health()
    assert health["engine_core"]["alive"] and health["status"] == "ok"
    workers = health["workers"]
    answers = {w: generate_on(info["address"]) for w, info in workers.items()}
    assert answers["w1"] == answers["w2"] and "Paris" in answers["w1"]  # greedy, same weights
    tree = psutil.Process(router.proc.pid).children(recursive=True)
    cores = [p for p in tree if "EngineCore" in " ".join(p.cmdline()) + p.name()]
    assert len(cores) == 1, [(p.pid, p.name()) for p in tree]
    core_mib = sum(p.memory_info().rss for p in [cores[0], *cores[0].children(recursive=True)])
    for info in workers.values():  # a worker holds a client, not a copy of the model
        assert psutil.Process(info["pid"]).memory_info().rss < core_mib / 2


def test_an_application_session_is_served_by_its_owner_through_the_router(router):
    status, head, opened = post(router.http + "/v1/sessions", {"model": MODEL})
    assert status == 201, opened
    sid, owner = opened["id"], opened["ref"]["owner_instance_id"]
    assert sid.endswith("." + owner) and head["Duplex-Owner-Instance"] == owner
    status, _, turn = post(f"{router.http}/v1/sessions/{sid}/generate",
                           {"messages": FRANCE, "stream": False,
                            "options": {"temperature": 0, "max_tokens": 16}})
    assert status == 200 and "Paris" in turn["output"]["text"], turn
    assert turn["request_id"].endswith("." + owner)  # minted request ids name their owner
    status, _, info = get_json(f"{router.http}/v1/sessions/{sid}")
    assert status == 200 and info["turns"] == 1
    other = next(w for w in router.health()["workers"].values() if w["health"]["instance_id"] != owner)
    status, _, refused = get_json(f"http://{other['address']}/v1/sessions/{sid}")
    assert status == 421 and refused["error"]["owner_instance_id"] == owner  # not via the router
    status, _, closed = get_json(f"{router.http}/v1/sessions/{sid}", method="DELETE")
    assert status == 200 and closed["state"] == "closed"


def test_an_abort_through_the_router_stops_its_generation_on_the_owner(router):
    finish: dict = {}
    with httpx.Client(base_url=router.http, timeout=120) as http:
        with http.stream("POST", "/v1/generate", json={
                "model": MODEL, "messages": STORY, "options": {"max_tokens": 400}}) as r:
            rid = r.headers["x-request-id"]
            assert rid.endswith("." + r.headers["duplex-owner-instance"])
            lines = r.iter_lines()
            for line in lines:  # the first text delta: the generation runs
                if line.startswith("event: text-delta"):
                    break
            aborted = threading.Thread(target=lambda: finish.update(
                answer=post(f"{router.http}/v1/requests/{rid}/abort", {})))
            aborted.start()
            for line in lines:
                if line.startswith("data:") and '"finish_reason"' in line:
                    finish["event"] = json.loads(line[5:])
            aborted.join()
    assert finish["answer"][0] == 200 and finish["answer"][2]["aborted"] is True
    assert finish["event"]["finish_reason"] == "cancelled"


def test_a_killed_worker_returns_on_a_spare_slot_of_the_same_core(router):
    before = router.health()
    core_pid = [p.pid for p in psutil.Process(router.proc.pid).children(recursive=True)
                if "EngineCore" in " ".join(p.cmdline()) + p.name()]
    os.kill(before["workers"]["w1"]["pid"], signal.SIGKILL)
    assert "Paris" in generate_on(before["workers"]["w2"]["address"])  # w2 goes on meanwhile
    deadline = time.monotonic() + 300
    while not router.health()["workers"]["w1"]["serving"]:
        assert time.monotonic() < deadline, router.output()
        time.sleep(0.5)
    after = router.health()
    assert after["workers"]["w1"]["restarts"] == 1 and after["engine_core"]["slots_left"] == 0
    assert "Paris" in generate_on(after["workers"]["w1"]["address"])
    still = [p.pid for p in psutil.Process(router.proc.pid).children(recursive=True)
             if "EngineCore" in " ".join(p.cmdline()) + p.name()]
    assert still == core_pid  # the same core: nothing was reloaded
