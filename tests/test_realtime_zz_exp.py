import asyncio, pytest, pytest_asyncio, time
from vllm_duplex.deploy import load_config
from vllm_duplex.engine import DuplexEngine
from vllm_duplex.realtime.serving import BackgroundServer
from vllm_duplex.realtime.client import RealtimeClient

pytestmark = pytest.mark.asyncio(loop_scope="module")

@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server():
    t = time.monotonic()
    async with BackgroundServer(DuplexEngine(load_config("scripted"))) as s:
        print("start", time.monotonic() - t)
        yield s

async def test_a(server):
    print("loop", id(asyncio.get_running_loop()))
    async with await RealtimeClient.connect(server.ws_url) as rt:
        pass

async def test_b(server):
    asyncio.create_task(asyncio.sleep(5))

async def test_c():
    t = time.monotonic()
    async with BackgroundServer(DuplexEngine(load_config("scripted"))) as s:
        async with await RealtimeClient.connect(s.ws_url) as rt:
            pass
    print("per-test", time.monotonic() - t)
