"""An escalated verification is shown where operators look: first and marked in `project_sessions_ready`, in
`session_status` over MCP, and in `taskgate session list` / `session show` (subprocesses on the same database).
SQLite and PostgreSQL; the sweeper runs on a fake clock advanced past 72 h, nothing sleeps."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from taskgate.application.sweeper import Sweeper
from taskgate.domain.access import Principal
from taskgate.infrastructure.db.engine import Database
from tests.builders import seed, start
from tests.conftest import SQL_BACKENDS, Services, make_git_repo, open_database, wire
from tests.e2e.test_cli import Cli
from tests.fakes import FakeClock
from tests.mcp.conftest import ToolCaller, connect

ALICE = Principal.operator("alice")


@dataclass
class Env:
    services: Services
    clock: FakeClock
    cli: Cli
    project: str

    async def sweep(self) -> list[tuple[str, str]]:
        report = await Sweeper(self.services.uow, self.services.sessions, self.clock).sweep_once()
        assert not report.errors, report.errors
        return [(a.session_id, a.action) for a in report.actions]


@pytest.fixture(params=SQL_BACKENDS)
async def env(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Env]:
    database, url = await open_database(request.param, request, tmp_path)
    assert isinstance(database, Database) and url is not None
    clock = FakeClock()
    services = wire(request.param, database, url, clock=clock)
    seeded = await seed(services, make_git_repo(tmp_path / "repo"), tasks=2)
    (tmp_path / "cli").mkdir()
    yield Env(services, clock, Cli(tmp_path / "cli", database_url=url), str(seeded.project.id))
    await database.dispose()


async def _to_verifying(env: Env, tools: ToolCaller, task_number: int) -> str:
    tasks = await env.services.tracker.list_tasks(int(env.project))
    session = await start(env.services, tasks[task_number])
    for trigger in ("plan_complete", "work_complete"):
        await tools.ok("session_fire", session_id=session.id, trigger=trigger, reason="done")
    return session.id


async def test_an_escalated_verification_is_listed_first_and_marked_until_it_leaves_verifying(env):
    async with connect(env.services, ALICE) as tools:
        late = await _to_verifying(env, tools, 0)
        env.clock.advance(hours=10)
        fresh = await _to_verifying(env, tools, 1)
        env.clock.advance(hours=63)  # late waited 73 h, fresh 63 h
        assert await env.sweep() == [(late, "escalated")]

        ready = await tools.ok("project_sessions_ready")
        assert ready["summary"] == "2 session(s) waiting for your decision (1 escalated, listed first)"
        first, second = ready["sessions"]
        assert (first["id"], first["escalated"], second["escalated"]) == (late, True, False)
        assert first["summary"].startswith("ESCALATED at 2026-01-04T")
        assert first["escalated_at"] is not None and second["escalated_at"] is None

        status = await tools.ok("session_status", session_id=late)
        assert status["escalated_at"].startswith("2026-01-04T") and "; ESCALATED at 2026-01-04T" in status["summary"]
        assert (await tools.ok("session_status", session_id=fresh))["escalated_at"] is None

        listed = {s["id"]: s["escalated_at"] for s in env.cli.json("session", "list", "-p", env.project)}
        assert listed[late].startswith("2026-01-04T") and listed[fresh] is None
        table = env.cli.ok("session", "list", "-p", env.project)
        assert "escalated" in table and "2026-01-04 01:00:00" in table
        assert env.cli.json("session", "show", late)["escalated_at"] == listed[late]
        shown = env.cli.ok("session", "show", late[:8])
        assert f"escalated  {listed[late][:19]}" in shown and "waiting too long for a decision" in shown
        assert "waiting too long" not in env.cli.ok("session", "show", fresh[:8])

        await tools.ok("project_decide", session_id=late, decision="request_changes", instructions="[agents] too")
        assert (await tools.ok("session_status", session_id=late))["escalated_at"] is None
        assert env.cli.json("session", "show", late)["escalated_at"] is None
        assert "[agents] too" in env.cli.ok("session", "show", late[:8])  # people's text, not Rich markup
        assert [s["escalated"] for s in (await tools.ok("project_sessions_ready"))["sessions"]] == [False]
