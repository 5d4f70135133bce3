"""Webhooks end to end: the events log of a real SQLite file and of PostgreSQL, delivered by `HttpWebhookSender`
to a real HTTP server on 127.0.0.1 that fails on purpose. Time is a FakeClock: nothing sleeps but the network."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from sqlalchemy import text

from taskgate.application.webhooks.outbox import LEASE_MARGIN_S, Backfill, Subscriber, WebhookDispatcher
from taskgate.infrastructure.db.engine import Database
from taskgate.infrastructure.db.unit_of_work import SqlAlchemyUnitOfWork
from taskgate.infrastructure.webhooks import HttpWebhookSender
from tests.builders import HAPPY_PATH, fire, seed, start
from tests.conftest import open_database, wire
from tests.fakes import FakeClock

SECRET = "correct horse battery staple"
TASKGATE = str(Path(sys.executable).with_name("taskgate"))


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    answered: int

    @property
    def event(self) -> dict:
        return json.loads(self.body)


Plan = Callable[[int, int], tuple[int, float]]  # (event id, nth request for it, from 1) -> (status, delay s)


class Receiver:
    """A real HTTP server in a thread. `plan` decides each answer; every request is recorded."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self.plan: Plan = lambda event_id, nth: (200, 0.0)
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                event_id = json.loads(body)["id"]
                with receiver._lock:
                    nth = 1 + sum(1 for r in receiver.received if r.event["id"] == event_id)
                    status, delay = receiver.plan(event_id, nth)
                    receiver.received.append(Received(self.path, dict(self.headers), body, status))
                if delay:
                    time.sleep(delay)  # the client gives up first: a timeout
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "text/plain")
                    self.end_headers()
                    self.wfile.write(b"ok" if status < 300 else b"receiver says no")
                except OSError:
                    pass

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/taskgate"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    def ids(self, answered: int | None = None) -> list[int]:
        return [r.event["id"] for r in self.received if answered is None or r.answered == answered]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    found = Receiver()
    found.thread.start()
    yield found
    found.server.shutdown()
    found.server.server_close()


def subscriber(receiver: Receiver, name: str = "ci", backfill: Backfill = "all", **options) -> Subscriber:
    """Gets the whole log by default: most tests here append their events before its first round."""
    return Subscriber(name=name, url=f"{receiver.url}/{name}", secret=SECRET, backfill=backfill, **options)


def dispatcher(uow, clock: FakeClock, *subscribers: Subscriber) -> WebhookDispatcher:
    return WebhookDispatcher(uow, clock, HttpWebhookSender(), list(subscribers))


async def append(services, clock: FakeClock, *kinds: str, session_id: str = "s-1") -> None:
    async with services.uow(write=True) as uow:
        for i, kind in enumerate(kinds):
            await uow.events.append(kind, clock.now(), {"n": i, "note": "héllo"}, session_id)
        await uow.commit()


async def deliveries(uow, subscriber_name: str = "ci"):
    async with uow(write=False) as work:
        return await work.deliveries.list(subscriber_name)


async def test_only_matching_events_arrive_signed_and_in_order(sql_services, receiver):
    clock = FakeClock()
    await append(sql_services, clock, "session.created", "task.added", "session.blocked", "tracker.beads_imported")
    await append(sql_services, clock, "session.transition", "worktree.orphans_pruned")
    outbox = dispatcher(sql_services.uow, clock, subscriber(receiver, events=("session.*",)))

    report = await outbox.run_once()

    assert (report.enqueued, report.delivered) == (3, 3)
    assert [r.event["kind"] for r in receiver.received] == ["session.created", "session.blocked", "session.transition"]
    assert receiver.ids() == [1, 3, 5]
    for request in receiver.received:
        expected = "sha256=" + hmac.new(SECRET.encode(), request.body, hashlib.sha256).hexdigest()
        assert hmac.compare_digest(request.headers["X-Taskgate-Signature"], expected)
        assert request.headers["X-Taskgate-Event"] == request.event["kind"]
        assert request.headers["X-Taskgate-Delivery"] == str(request.event["id"])
        assert request.headers["Content-Type"] == "application/json"
        assert request.path == "/hooks/taskgate/ci"
        assert set(request.event) == {"id", "kind", "session_id", "at", "payload"}
        assert request.event["session_id"] == "s-1" and request.event["payload"]["note"] == "héllo"
    assert [d.status for d in await deliveries(sql_services.uow)] == ["delivered"] * 3
    assert (await outbox.run_once()).sent == 0


async def test_failures_are_retried_with_exponential_backoff_and_hold_later_events_back(sql_services, receiver):
    clock = FakeClock()
    receiver.plan = lambda event_id, nth: (500, 0.0) if event_id == 1 and nth <= 3 else (200, 0.0)
    outbox = dispatcher(sql_services.uow, clock, subscriber(receiver, backoff_base_s=2, backoff_max_s=5))
    await append(sql_services, clock, "session.created", "session.transition")

    await outbox.run_once()  # attempt 1 of event 1 fails; event 2 waits behind it
    [first, second] = await deliveries(sql_services.uow)
    assert (first.attempts, first.status, first.last_error) == (1, "pending", "HTTP 500: receiver says no")
    assert second.attempts == 0

    waits = []
    for _ in range(3):
        [head, _] = await deliveries(sql_services.uow)
        wait = (head.next_attempt_at - clock.current).total_seconds()
        waits.append(round(wait, 3))
        clock.advance(seconds=wait - 0.01)
        assert (await outbox.run_once()).sent == 0  # not yet due
        clock.advance(seconds=0.02)
        await outbox.run_once()

    assert waits == [2, 4, 5]  # base·2^(n-1), capped at backoff_max_s
    assert receiver.ids() == [1, 1, 1, 1, 2]  # event 2 only after event 1 got through
    assert [(d.status, d.attempts) for d in await deliveries(sql_services.uow)] == [("delivered", 4), ("delivered", 1)]
    assert [r.headers["X-Taskgate-Attempt"] for r in receiver.received] == ["1", "2", "3", "4", "1"]


async def test_a_delivery_is_given_up_after_max_attempts_and_the_next_event_goes_out(sql_services, receiver):
    clock = FakeClock()
    receiver.plan = lambda event_id, nth: (503, 0.0) if event_id == 1 else (204, 0.0)
    outbox = dispatcher(sql_services.uow, clock, subscriber(receiver, max_attempts=3, backoff_base_s=1))
    await append(sql_services, clock, "session.created", "session.transition")

    for _ in range(5):
        await outbox.run_once()
        clock.advance(seconds=60)

    gave_up, delivered = await deliveries(sql_services.uow)
    assert (gave_up.status, gave_up.attempts, gave_up.last_error) == ("failed", 3, "HTTP 503: receiver says no")
    assert (delivered.status, delivered.delivered_at is not None) == ("delivered", True)
    assert receiver.ids() == [1, 1, 1, 2]
    [status] = await outbox.status()
    assert (status.pending, status.delivered, status.failed) == (0, 1, 1)


async def test_a_timeout_and_a_refused_connection_are_failed_attempts_with_a_reason(sql_services, receiver):
    clock = FakeClock()
    receiver.plan = lambda event_id, nth: (200, 1.0) if nth == 1 else (200, 0.0)
    down = Subscriber(name="down", url="http://127.0.0.1:9/nobody-listens", secret=SECRET, backfill="all")
    outbox = dispatcher(sql_services.uow, clock, subscriber(receiver, timeout_s=0.2), down)
    await append(sql_services, clock, "session.created")

    report = await outbox.run_once()

    assert report.retried == 2
    [slow] = await deliveries(sql_services.uow)
    [refused] = await deliveries(sql_services.uow, "down")
    assert slow.last_error == "timed out after 0.2s"
    assert refused.last_error.startswith("connection failed")
    clock.advance(seconds=1)
    assert (await outbox.run_once()).delivered == 1  # the slow receiver answers in time now


async def test_a_restart_neither_resends_delivered_events_nor_loses_pending_ones(sql_services, receiver):
    clock = FakeClock()
    receiver.plan = lambda event_id, nth: (500, 0.0) if event_id == 2 and nth == 1 else (200, 0.0)
    hook = subscriber(receiver, backoff_base_s=10)
    await append(sql_services, clock, "session.created", "session.transition", "session.transition")
    first = dispatcher(sql_services.uow, clock, hook)
    await first.run_once()  # 1 delivered, 2 failed once, 3 waiting behind it
    await append(sql_services, clock, "session.blocked")  # 4: written while no dispatcher runs
    assert receiver.ids() == [1, 2]

    reopened = Database(sql_services.url)  # a new process on the same database
    try:

        def uow(*, write: bool) -> SqlAlchemyUnitOfWork:
            return SqlAlchemyUnitOfWork(reopened, write=write)

        clock.advance(seconds=10)
        await dispatcher(uow, clock, hook).run_once()
        await dispatcher(uow, clock, hook).run_once()  # and another: nothing is left to send
    finally:
        await reopened.dispose()

    assert receiver.ids(answered=200) == [1, 2, 3, 4]
    assert receiver.ids() == [1, 2, 2, 3, 4]
    assert [d.status for d in await deliveries(sql_services.uow)] == ["delivered"] * 4


async def test_a_send_cut_off_by_a_crash_is_sent_again_with_the_same_delivery_id(sql_services, receiver):
    clock = FakeClock()
    answered = threading.Event()

    def plan(event_id: int, nth: int) -> tuple[int, float]:
        answered.set()
        return 200, 0.0

    receiver.plan = plan
    hook = subscriber(receiver, timeout_s=2)
    await append(sql_services, clock, "session.created")
    crashing = dispatcher(sql_services.uow, clock, hook)
    assert await crashing.enqueue_new() == 1

    # The receiver got the request but the dispatcher dies before it records the answer.
    [head] = await deliveries(sql_services.uow)
    async with sql_services.uow(write=True) as uow:
        lease = timedelta(seconds=hook.timeout_s + LEASE_MARGIN_S)
        assert await uow.deliveries.claim(head.id, 0, clock.now(), clock.now() + lease)
        await uow.commit()
    event = (await _head(sql_services.uow)).event
    await HttpWebhookSender().send(hook.url, SECRET, event, timeout_s=2, attempt=1)
    assert answered.is_set()

    restarted = dispatcher(sql_services.uow, clock, hook)
    assert (await restarted.run_once()).sent == 0  # the claim still holds
    clock.advance(seconds=hook.timeout_s + LEASE_MARGIN_S)
    assert (await restarted.run_once()).delivered == 1
    assert [r.headers["X-Taskgate-Delivery"] for r in receiver.received] == ["1", "1"]  # the receiver dedupes


async def _head(uow, name: str = "ci"):
    async with uow(write=False) as work:
        return await work.deliveries.head(name)


async def test_two_subscribers_each_get_their_events_in_order_from_a_real_session(sql_services, receiver, git_repo):
    clock = FakeClock()
    receiver.plan = lambda event_id, nth: (500, 0.0) if nth == 1 and event_id % 3 == 0 else (200, 0.0)
    seeded = await seed(sql_services, git_repo, tasks=1)
    await fire(sql_services, await start(sql_services, seeded.tasks[0]), *HAPPY_PATH)
    async with sql_services.uow(write=False) as uow:
        log = await uow.events.list(limit=1000)
    sessions_only = subscriber(receiver, "sessions", events=("session.*",), backoff_base_s=1)
    everything = subscriber(receiver, "all", backoff_base_s=1)
    outbox = dispatcher(sql_services.uow, clock, sessions_only, everything)

    for _ in range(10):
        await outbox.run_once()
        clock.advance(seconds=1)

    def delivered_to(name: str) -> list[int]:
        return [r.event["id"] for r in receiver.received if r.answered == 200 and r.path.endswith(f"/{name}")]

    assert [e["id"] for e in log if e["kind"].startswith("session.")] == delivered_to("sessions")
    assert [e["id"] for e in log] == delivered_to("all")
    assert {e["kind"] for e in log} >= {"session.created", "session.transition"}


@pytest.mark.postgres
async def test_an_event_committed_after_a_newer_one_is_not_skipped_on_postgresql(request, tmp_path, receiver):
    """PostgreSQL hands out event ids before commit, so id 1 can commit after id 2. The enqueuer waits for
    writers of events in flight instead of moving its cursor past an id that is not visible yet."""
    database, url = await open_database("postgresql", request, tmp_path)
    services = wire("postgresql", database, url)
    clock = FakeClock()
    try:
        slow = services.uow(write=True)
        await slow.__aenter__()
        try:
            await slow.events.append("session.created", clock.now(), {}, "slow")  # id 1, not committed yet
            # PostgreSQL's unit holds an event's INSERT for its next statement (pg_writes.py): a read sends it, so
            # the slow writer has taken id 1 and holds its lock, as a writer with more to do would
            await slow.events.high_water()
            await append(services, clock, "session.transition")  # id 2, committed
            enqueuing = asyncio.create_task(dispatcher(services.uow, clock, subscriber(receiver)).enqueue_new())
            done, _ = await asyncio.wait({enqueuing}, timeout=0.3)
            assert not done  # waiting for the slow writer
            await slow.commit()
        finally:
            await slow.__aexit__(None, None, None)
        assert await asyncio.wait_for(enqueuing, 10) == 2
        assert [d.event_id for d in await deliveries(services.uow)] == [1, 2]
    finally:
        await database.dispose()


async def test_the_server_delivers_in_the_background_while_it_runs(tmp_path, receiver):
    """`taskgate serve` runs the dispatcher next to the MCP server: an event written while it runs goes out."""
    from taskgate.entrypoints.mcp.runner import _OpenApp
    from taskgate.infrastructure.settings import Settings, WebhookSettings

    arrived = threading.Event()

    def plan(event_id: int, nth: int) -> tuple[int, float]:
        arrived.set()
        return 200, 0.0

    receiver.plan = plan
    hook = WebhookSettings(
        name="ci", url=f"{receiver.url}/ci", secret=SECRET, events=["task.status_set"], backfill="all"
    )  # "all": the event may be written before the dispatcher's first round
    settings = Settings(data_dir=tmp_path / "data", webhooks=[hook])
    async with _OpenApp(settings)() as app:
        async with app.uow(write=True) as uow:
            await uow.events.append("task.status_set", app.clock.now(), {"task": "DEMO-1"})
            await uow.commit()
        assert await asyncio.to_thread(arrived.wait, 10)
    [request] = receiver.received
    assert request.event["kind"] == "task.status_set"


async def test_a_subscriber_named_in_escalation_receives_session_escalated_whatever_its_filter(
    sql_services, receiver, git_repo, tmp_path
):
    """`[escalation] webhooks = ["ops"]`: ops gets the sweeper's `session.escalated` although its own filter wants
    only task events; a subscriber not named there gets it only if its filter says so."""
    from taskgate.application.sweeper import ESCALATED_EVENT, Sweeper
    from taskgate.bootstrap import build_outbox
    from taskgate.infrastructure.settings import EscalationSettings, Settings, WebhookSettings

    clock = FakeClock()
    services = wire(sql_services.backend, sql_services.database, sql_services.url, clock=clock)
    seeded = await seed(services, git_repo, tasks=1)
    waiting = await fire(services, await start(services, seeded.tasks[0]), "plan_complete", "work_complete")
    hooks = [
        WebhookSettings(name="ops", url=f"{receiver.url}/ops", secret=SECRET, events=["task.added"], backfill="all"),
        WebhookSettings(name="ci", url=f"{receiver.url}/ci", secret=SECRET, events=["decision.*"], backfill="all"),
    ]
    settings = Settings(data_dir=tmp_path / "data", webhooks=hooks, escalation=EscalationSettings(webhooks=["ops"]))
    outbox = build_outbox(settings, services.uow, clock)
    assert outbox is not None and (await outbox.run_once()).delivered == 1  # ops: task.added

    clock.advance(hours=73)
    [action] = (await Sweeper(services.uow, services.sessions, clock).sweep_once()).actions
    assert action.action == "escalated"
    assert (await outbox.run_once()).delivered == 1

    [added, escalated] = receiver.received
    assert added.path.endswith("/ops") and added.event["kind"] == "task.added"
    assert escalated.path.endswith("/ops") and escalated.headers["X-Taskgate-Event"] == ESCALATED_EVENT
    assert escalated.event["session_id"] == waiting.id
    assert {"waiting_since", "fails_at", "reason"} <= set(escalated.event["payload"])
    expected = "sha256=" + hmac.new(SECRET.encode(), escalated.body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(escalated.headers["X-Taskgate-Signature"], expected)
    assert [s.events for s in await outbox.status()] == [["task.added", ESCALATED_EVENT], ["decision.*"]]


# Where a new subscriber starts (issue 18): at the committed high-water mark when it is first seen, fixed by a
# `start` marker row, unless it asks for the history (backfill = "all").


async def start_markers(services, name: str) -> int:
    """How many `start` marker rows the subscriber has (the CLI and `list` never show markers)."""
    async with services.database.connect() as conn:
        query = text("SELECT count(*) FROM webhook_deliveries WHERE subscriber = :name AND status = 'start'")
        return int((await conn.execute(query, {"name": name})).scalar())


def on(database: Database):
    """A unit of work factory on `database`: one `Database` per simulated process."""

    def uow(*, write: bool) -> SqlAlchemyUnitOfWork:
        return SqlAlchemyUnitOfWork(database, write=write)

    return uow


async def test_a_new_subscriber_starts_at_the_committed_high_water_and_a_restart_does_not_move_it(
    sql_services, receiver
):
    clock = FakeClock()
    await append(sql_services, clock, "session.created", "session.transition", "task.added")
    late = subscriber(receiver, "late", backfill="none")
    history = subscriber(receiver, "history", backfill="all")

    first = await dispatcher(sql_services.uow, clock, late, history).run_once()

    assert (first.enqueued, first.delivered) == (3, 3)
    assert [r.path.rsplit("/", 1)[1] for r in receiver.received] == ["history"] * 3
    async with sql_services.uow(write=False) as uow:
        assert (await uow.deliveries.start("late"), await uow.deliveries.cursor("late")) == (3, 3)
        assert await uow.deliveries.start("history") is None
    await append(sql_services, clock, "session.blocked", "task.added")

    reopened = Database(sql_services.url)  # a restart: a new process on the same database
    try:
        again = dispatcher(on(reopened), clock, late, history)
        await again.run_once()
        statuses = {s.name: s for s in await again.status()}
    finally:
        await reopened.dispose()

    def got(name: str) -> list[int]:
        return [r.event["id"] for r in receiver.received if r.path.endswith(f"/{name}")]

    assert got("late") == [4, 5]
    assert got("history") == [1, 2, 3, 4, 5]
    assert (statuses["late"].started_after_event_id, statuses["late"].delivered) == (3, 2)
    assert (statuses["history"].started_after_event_id, statuses["history"].started) == (None, True)
    assert await start_markers(sql_services, "late") == 1


class _Racing:
    """A unit of work factory whose write units' first cursor read of a new subscriber waits (up to 0.5 s) until
    every dispatcher has made that read too, and which counts the start markers the dispatchers try to insert.
    On PostgreSQL all of them get there (they hold compatible SHARE locks on `events`), so they all decide that
    the subscriber is new and all insert a marker: the worst case, every time. On SQLite write units are
    serialised, so the first one waits alone, then the others find its marker."""

    def __init__(self, uow, barrier: asyncio.Barrier, tries: list[int]) -> None:
        self._uow, self._barrier, self._tries = uow, barrier, tries

    def __call__(self, *, write: bool):
        racing = self

        class Unit:
            async def __aenter__(self):
                self.inner = racing._uow(write=write)
                work = await self.inner.__aenter__()
                if write:
                    work.deliveries = _RacingDeliveries(work.deliveries, racing._barrier, racing._tries)
                return work

            async def __aexit__(self, *exc):
                return await self.inner.__aexit__(*exc)

        return Unit()


class _RacingDeliveries:
    def __init__(self, inner, barrier: asyncio.Barrier, tries: list[int]) -> None:
        self._inner, self._barrier, self._tries = inner, barrier, tries

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    async def cursor(self, name: str) -> int:
        found = await self._inner.cursor(name)
        if found == 0:
            with contextlib.suppress(TimeoutError, asyncio.BrokenBarrierError):
                await asyncio.wait_for(self._barrier.wait(), 0.5)
        return found

    async def mark_start(self, name: str, event_id: int) -> None:
        self._tries.append(event_id)
        await self._inner.mark_start(name, event_id)


async def test_dispatchers_that_see_a_new_subscriber_at_once_start_it_once_and_lose_no_event(sql_services, receiver):
    """Four dispatchers (four processes: one `Database` each) see the new subscriber in the same instant; then
    they deliver while events keep being written. One start marker, at the events that were there before, and
    every later event delivered once, in order."""
    clock = FakeClock()
    await append(sql_services, clock, *["before"] * 5)
    late = subscriber(receiver, "late", backfill="none")
    processes = [Database(sql_services.url) for _ in range(4)]
    barrier, tries = asyncio.Barrier(len(processes)), []
    try:
        racing = [dispatcher(_Racing(on(db), barrier, tries), clock, late) for db in processes]
        assert await asyncio.gather(*(d.enqueue_new() for d in racing)) == [0, 0, 0, 0]

        assert tries == ([5] * 4 if sql_services.backend == "postgresql" else [5])  # the race did happen
        assert await start_markers(sql_services, "late") == 1

        async def write(n: int) -> None:
            for _ in range(n):
                await append(sql_services, clock, "after")
                await asyncio.sleep(0.005)

        plain = [dispatcher(on(db), clock, late) for db in processes]
        await asyncio.gather(write(12), *(d.run_once() for d in plain for _ in range(3)))
        while (await plain[0].run_once()).sent:
            pass
    finally:
        for db in processes:
            await db.dispose()

    async with sql_services.uow(write=False) as uow:
        log = [e["id"] for e in await uow.events.list(limit=1000)]
        assert await uow.deliveries.start("late") == 5
    assert len(log) == 17
    assert receiver.ids() == [i for i in log if i > 5]  # each later event once, in order; none of the 5 before
    assert await start_markers(sql_services, "late") == 1


async def test_three_deliver_processes_send_each_event_once(sql_services, receiver, tmp_path):
    """Three OS processes (`taskgate webhooks deliver --once`, three node ids) work on one database at the same
    moment, for three subscribers: each delivery is claimed by one of them (a compare-and-swap on its attempts), so
    every subscriber gets every event exactly once, in order, whoever sent it."""
    clock = FakeClock()
    await append(sql_services, clock, *["work"] * 30)
    receiver.plan = lambda event_id, nth: (200, 0.02)  # slow enough that the three processes' rounds overlap
    config = tmp_path / "taskgate.toml"
    config.write_text("".join(f'[[webhooks]]\nname = "{name}"\nurl = "{receiver.url}/{name}"\nsecret = "{SECRET}"\n'
                              f'backfill = "all"\n\n' for name in ("a", "b", "c")))  # fmt: skip
    base = {k: v for k, v in os.environ.items() if not k.startswith("TASKGATE_")}
    base |= {"TASKGATE_CONFIG": str(config), "TASKGATE_DATABASE_URL": str(sql_services.url)}
    runs = [
        await asyncio.create_subprocess_exec(
            TASKGATE,
            "webhooks",
            "deliver",
            "--once",
            cwd=tmp_path,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=base | {"TASKGATE_DATA_DIR": str(tmp_path / f"data-{n}"), "TASKGATE_NODE__ID": f"node-{n}"},
        )
        for n in range(3)
    ]
    outputs = [await asyncio.wait_for(run.communicate(), 120) for run in runs]
    assert [run.returncode for run in runs] == [0, 0, 0], [err.decode() for _, err in outputs]

    async with sql_services.uow(write=False) as uow:
        log = [e["id"] for e in await uow.events.list(limit=1000)]
    assert len(log) == 30
    for name in ("a", "b", "c"):  # every event once, in order, to each subscriber
        assert [r.event["id"] for r in receiver.received if r.path.endswith(f"/{name}")] == log
    sent = [int(out.decode().rsplit("delivered ", 1)[1].split(",")[0]) for out, _ in outputs]
    assert sum(sent) == 90, sent  # what each process says it sent adds up: none sent twice
