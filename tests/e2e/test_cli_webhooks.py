"""`taskgate webhooks` as a user runs it: deliveries to a real HTTP server, then their status."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import make_git_repo
from tests.e2e.test_cli import Cli, seed
from tests.integration.test_webhooks import SECRET, receiver  # noqa: F401 (the fixture)


def configure(cli: Cli, url: str, events: str = '["*"]') -> None:
    config = cli.workdir / "config" / "taskgate.toml"
    config.parent.mkdir(exist_ok=True)
    config.write_text(
        f'[[webhooks]]\nname = "ci"\nurl = "{url}"\nsecret_env = "CI_HOOK_SECRET"\nevents = {events}\n'
        "max_attempts = 2\nbackoff_base_s = 0\n"
    )


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
