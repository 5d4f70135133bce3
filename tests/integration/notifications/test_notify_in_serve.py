"""The notifier inside `taskgate serve` (its lifespan): under the `notify` lease of this node, it tells a real
HTTP receiver of an event written while the service runs, and a second node on the same database sends nothing."""

from __future__ import annotations

import asyncio

from taskgate.application.notifications.notifier import NOTIFY_LEASE
from taskgate.entrypoints.mcp.runner import _OpenApp
from taskgate.infrastructure.settings import NodeSettings, NotifySettings, Settings
from tests.integration.notifications.conftest import Receiver


async def _cursor_set(app) -> None:
    for _ in range(200):
        async with app.uow(write=False) as uow:
            if await uow.notifications.cursor() is not None:
                return
        await asyncio.sleep(0.05)
    raise AssertionError("the notifier never started its cursor")


async def test_serve_runs_the_notifier_under_its_lease_and_one_node_sends(tmp_path, receiver: Receiver):
    notify = NotifySettings(channels=[receiver.url], batch_s=0.2, interval_s=0.1, console_url="http://console.test")
    one = Settings(data_dir=tmp_path / "data", notify=notify, node=NodeSettings(id="node-one"))
    two = one.model_copy(update={"node": NodeSettings(id="node-two")})
    async with _OpenApp(one)() as first, _OpenApp(two)() as _second:
        await _cursor_set(first)
        async with first.uow(write=True) as uow:
            payload = {"question_id": "q1", "text": "which port?", "kind": "question"}
            await uow.events.append("question.asked", first.clock.now(), payload, "sess-1")
            await uow.commit()
        assert await asyncio.to_thread(receiver.arrived.wait, 10)
        await asyncio.sleep(0.5)  # a second node that also sent would have by now
        async with first.uow(write=True) as uow:  # who holds it: a refused take says (rolled back, not committed)
            now = first.clock.now()
            lease = await uow.leases.acquire(NOTIFY_LEASE, "probe", "probe", now, now)
    [body] = receiver.bodies()
    assert "an agent asks a question: http://console.test/sessions/sess-1" in body and "which port" not in body
    assert lease.node_id in ("node-one", "node-two")  # one of them, and only one message was sent
