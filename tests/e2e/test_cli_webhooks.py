"""`taskgate webhooks` as a user runs it: deliveries to a real HTTP server, then their status."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import make_git_repo
from tests.e2e.test_cli import TASKGATE, Cli, seed
from tests.e2e.test_crash_points import _pg_database
from tests.integration.webhooks.test_webhooks import SECRET, receiver  # noqa: F401 (the fixture)
from tests.support.served import db_rows


def configure(cli: Cli, url: str, events: str = '["*"]', *, backfill: str = "all") -> None:
    """One subscriber, ci. The tests that seed first and deliver after want the history: backfill = "all"."""
    write_config(cli, hook_toml("ci", url, events, backfill))


def hook_toml(name: str, url: str, events: str = '["*"]', backfill: str | None = None) -> str:
    line = "" if backfill is None else f'backfill = "{backfill}"\n'
    return (
        f'[[webhooks]]\nname = "{name}"\nurl = "{url}"\nsecret_env = "CI_HOOK_SECRET"\nevents = {events}\n'
        f"max_attempts = 2\nbackoff_base_s = 0\n{line}\n"
    )


def write_config(cli: Cli, *hooks: str) -> None:
    config = cli.workdir / "config" / "taskgate.toml"
    config.parent.mkdir(exist_ok=True)
    config.write_text("".join(hooks))


def test_deliver_once_sends_the_matching_events_and_status_counts_them(tmp_path: Path, receiver):  # noqa: F811
    make_git_repo(tmp_path / "repo")
    cli = Cli(tmp_path)
    assert "no webhooks configured" in cli.fails("webhooks", "status")
    seed(cli)
    configure(cli, f"{receiver.url}/ci", '["task.*", "plan.*"]')
    assert "CI_HOOK_SECRET" in cli.fails("webhooks", "deliver", "--once")
    cli.env["CI_HOOK_SECRET"] = SECRET

    out = cli.ok("webhooks", "deliver", "--once")

    kinds = [r.event["kind"] for r in receiver.received]
    assert kinds == ["plan.added", "task.added", "task.added"]
    assert "ci event" in out and "attempt 1: delivered" in out
    assert "enqueued 3, delivered 3, will retry 0, gave up 0" in out
    [status] = cli.json("webhooks", "status")
    assert (status["name"], status["pending"], status["delivered"], status["failed"]) == ("ci", 0, 3, 0)
    assert "delivered 0" in cli.ok("webhooks", "deliver", "--once")  # nothing new, nothing resent


def test_deliver_once_gives_up_on_a_failing_receiver_and_status_shows_why(tmp_path: Path, receiver):  # noqa: F811
    make_git_repo(tmp_path / "repo")
    cli = Cli(tmp_path)
    cli.env["CI_HOOK_SECRET"] = SECRET
    seed(cli)
    receiver.plan = lambda event_id, nth: (500, 0.0)
    configure(cli, f"{receiver.url}/ci", '["plan.added"]')

    out = cli.ok("webhooks", "deliver", "--once")

    assert "attempt 1: retried: HTTP 500" in out and "attempt 2: failed: HTTP 500" in out
    [status] = cli.json("webhooks", "status")
    assert (status["failed"], status["pending"]) == (1, 0)
    table = cli.ok("webhooks", "status")
    assert "ci" in table and "failed" in table


@pytest.fixture(params=["sqlite", "postgresql"])
def hooks_cli(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cli]:
    """A CLI workspace on SQLite or on a PostgreSQL database of its own, with the webhook secret set."""
    databases = _pg_database() if request.param == "postgresql" else iter([None])
    make_git_repo(tmp_path / "repo")
    cli = Cli(tmp_path, database_url=next(databases))
    cli.env["CI_HOOK_SECRET"] = SECRET
    yield cli
    for _ in databases:  # drops the PostgreSQL database
        pass


def test_a_subscriber_added_later_gets_the_later_events_and_one_with_backfill_all_the_history(
    hooks_cli: Cli,
    receiver,  # noqa: F811
):
    """Issue 18: events happen, then two subscribers are added to the config. `late` (no backfill: "none")
    starts at that moment; `history` (backfill = "all") gets the whole log. The first sweep runs as three
    `taskgate webhooks deliver --once` processes at once: one start, no duplicates."""
    cli = hooks_cli
    seed(cli)
    write_config(
        cli, hook_toml("late", f"{receiver.url}/late"), hook_toml("history", f"{receiver.url}/history", backfill="all")
    )
    statuses = {s["name"]: s for s in cli.json("webhooks", "status")}
    assert (statuses["late"]["started"], statuses["late"]["backfill"]) == (False, "none")

    sweeps = [
        subprocess.Popen(
            [TASKGATE, "webhooks", "deliver", "--once"],
            cwd=cli.workdir,
            env=cli.env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(3)
    ]
    for sweep in sweeps:
        out, err = sweep.communicate(timeout=120)
        assert sweep.returncode == 0, err

    def got(name: str) -> list[int]:
        return [r.event["id"] for r in receiver.received if r.path.endswith(f"/{name}")]

    history = got("history")
    assert got("late") == [] and history == sorted(set(history)) and len(history) >= 4  # in order, each once
    statuses = {s["name"]: s for s in cli.json("webhooks", "status")}
    assert statuses["late"]["started_after_event_id"] == history[-1]
    assert (statuses["history"]["started_after_event_id"], statuses["history"]["delivered"]) == (None, len(history))
    table = cli.ok("webhooks", "status")
    assert f"after event {history[-1]}" in table and "beginning" in table
    markers = asyncio.run(
        db_rows(cli, "SELECT count(*) FROM webhook_deliveries WHERE status = 'start' AND subscriber = {}", "late")
    )
    assert markers == [(1,)]

    cli.ok("task", "add", "Later work", "--plan", "1")
    out = cli.ok("webhooks", "deliver", "--once")

    later = got("late")
    assert later and later[0] > history[-1] and got("history") == history + later
    assert {r.event["kind"] for r in receiver.received if r.path.endswith("/late")} == {"task.added"}
    assert f"enqueued {2 * len(later)}" in out

    # A started subscriber is not moved by a changed backfill: late asks for the history now, and gets nothing.
    write_config(
        cli, hook_toml("late", f"{receiver.url}/late", backfill="all"), hook_toml("history", f"{receiver.url}/history")
    )
    assert "enqueued 0, delivered 0" in cli.ok("webhooks", "deliver", "--once")
    assert got("late") == later


def test_a_bad_backfill_is_refused_naming_the_field(tmp_path: Path):
    cli = Cli(tmp_path)
    write_config(cli, hook_toml("ci", "http://127.0.0.1:9/ci", backfill="yesterday"))
    error = cli.fails("webhooks", "status")
    assert "webhooks.0.backfill" in error and "'none' or 'all'" in error
