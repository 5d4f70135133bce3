"""The loopback MCP endpoint a process serves its agents: one listener however many agents start at once, alive
while they run, agent tokens only."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from taskgate.application.trackers.builtin import AddTask
from taskgate.bootstrap import App, bootstrap, load_settings
from taskgate.entrypoints.mcp.agent_endpoint import LoopbackEndpoint
from tests.builders import OPERATOR, seed, start
from tests.conftest import make_git_repo

INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                         "clientInfo": {"name": "test", "version": "1"}}}  # fmt: skip
HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


@pytest.fixture
async def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("TASKGATE_CONFIG", raising=False)
    opened = await bootstrap(load_settings(tmp_path, data_dir=tmp_path / "data"))
    yield opened
    await opened.close()


async def post(url: str, token: str) -> tuple[int, str]:
    """POST an MCP initialize with the token; (status, body). Raises: URLError when nothing listens."""

    def send() -> tuple[int, str]:
        request = urllib.request.Request(url, json.dumps(INITIALIZE).encode(), method="POST",
                                         headers={**HEADERS, "authorization": f"Bearer {token}"})  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=10) as reply:
                return reply.status, reply.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    return await asyncio.to_thread(send)


async def test_many_concurrent_acquirers_share_one_listener_that_stops_after_the_last(app: App):
    endpoint = LoopbackEndpoint(app, grace_s=0.2)
    urls = await asyncio.gather(*(endpoint.acquire() for _ in range(50)))
    assert len(set(urls)) == 1 and urls[0].startswith("http://127.0.0.1:") and endpoint.running
    await asyncio.gather(*(endpoint.release() for _ in range(49)))
    await asyncio.sleep(0.4)
    assert endpoint.running  # one holder left
    await endpoint.release()
    again = await endpoint.acquire()  # taken again within the grace period: the same listener
    assert again == urls[0]
    await endpoint.release()
    await asyncio.sleep(0.6)
    assert not endpoint.running
    with pytest.raises(urllib.error.URLError):
        await post(urls[0], "whatever")


async def test_interleaved_acquire_and_release_never_stop_a_listener_in_use(app: App):
    endpoint = LoopbackEndpoint(app, grace_s=0.0)

    async def agent(n: int) -> bool:
        url = await endpoint.acquire()
        await asyncio.sleep(0.001 * (n % 7))
        alive = endpoint.running and endpoint.url == url
        await endpoint.release()
        return alive

    assert all(await asyncio.gather(*(agent(n) for n in range(100))))
    await endpoint.close()
    assert not endpoint.running


async def test_it_admits_agent_tokens_only(app: App, tmp_path: Path):
    seeded = await seed(app, make_git_repo(tmp_path / "repo"), tasks=0)
    task = await app.tracker.add_task(AddTask(seeded.project.id, "t", plan_id=seeded.plan.id))
    session = await start(app, task)
    agent = await app.access.create_agent_token(session.id, "agent")
    operator = await app.access.create_operator_token(OPERATOR)
    endpoint = LoopbackEndpoint(app)
    url = await endpoint.acquire()
    try:
        assert (await post(url, agent.secret))[0] == 200
        status, body = await post(url, operator.secret)
        assert status == 403 and "serves agents only" in body
        assert (await post(url, "tg_not-a-token"))[0] == 403
    finally:
        await endpoint.close()
