"""session_list and events_list over MCP (in-process client), on memory, SQLite and PostgreSQL."""

from __future__ import annotations

from taskgate.domain.access import Principal
from tests.builders import fire, seed, start
from tests.mcp.conftest import connect

ALICE = Principal.operator("alice")


async def test_session_list_pages_newest_first_with_filters_and_the_status_shape(services, git_repo) -> None:
    seeded = await seed(services, git_repo, tasks=3)
    first = await start(services, seeded.tasks[0])
    second = await fire(services, await start(services, seeded.tasks[1]), "plan_complete", "work_complete")
    third = await start(services, seeded.tasks[2])
    async with connect(services, ALICE) as tools:
        page = await tools.ok("session_list", limit=2)
        assert (page["total"], [s["id"] for s in page["sessions"]]) == (3, [third.id, second.id])
        assert page["summary"] == "sessions 1-2 of 3"
        rest = await tools.ok("session_list", limit=2, offset=2)
        assert [s["id"] for s in rest["sessions"]] == [first.id]
        verifying = await tools.ok("session_list", project="repo", state=["verifying"], operator="alice")
        assert [s["id"] for s in verifying["sessions"]] == [second.id]
        status = await tools.ok("session_status", session_id=second.id)
        listed = verifying["sessions"][0]
        assert set(listed) == set(status) and listed["allowed_triggers"] == status["allowed_triggers"]
        assert (await tools.ok("session_list", operator="nobody"))["total"] == 0
        assert "unknown state 'done'" in await tools.refused("session_list", state=["done"])


async def test_events_list_filters_by_session_kind_prefix_and_time(services, git_repo) -> None:
    seeded = await seed(services, git_repo, tasks=2)
    session = await start(services, seeded.tasks[0])
    await start(services, seeded.tasks[1])
    async with connect(services, ALICE) as tools:
        mine = await tools.ok("events_list", session_id=session.id[:8], kind="session.")
        assert {e["kind"] for e in mine["events"]} == {"session.created", "session.transition"}
        assert {e["session_id"] for e in mine["events"]} == {session.id}
        moved = await tools.ok("events_list", session_id=session.id, kind="session.transition")
        moves = [(e["payload"]["from"], e["payload"]["to"]) for e in moved["events"]]
        assert moves[-1] == ("ready", "planning") and len(moves) == len(mine["events"]) - 1
        everything = await tools.ok("events_list", limit=10_000)
        assert [e["id"] for e in everything["events"]] == sorted(e["id"] for e in everything["events"])
        last = everything["events"][-1]
        assert [e["id"] for e in (await tools.ok("events_list", since=last["at"]))["events"]][-1] == last["id"]
        assert (await tools.ok("events_list", until="2000-01-01T00:00:00Z"))["events"] == []
        assert "InvalidInput" in await tools.refused("events_list", kind="Tracker failed!")
        assert "since is after until" in await tools.refused(
            "events_list", since="2030-01-01T00:00:00Z", until="2020-01-01T00:00:00Z"
        )
