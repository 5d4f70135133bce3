"""Worktree hooks as a user sets them up: `[hooks]` in the `taskgate.toml` that `taskgate init` wrote, through the real
executable, around the built-in scripted coder run by `session execute`, and before the cancelled worktree goes."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.test_agents_own_repo import started
from tests.e2e.test_init import User, fresh_repo


def test_every_hook_runs_at_its_point_through_the_cli(tmp_path: Path):
    user = User(fresh_repo(tmp_path / "shop"))
    user.ok("init")
    marks = tmp_path / "marks.txt"
    config = user.repo / ".taskgate" / "taskgate.toml"
    mark = f'echo "$TASKGATE_HOOK ${{TASKGATE_AGENT_ID:+agent}}" >> {marks}'
    config.write_text(config.read_text() + f"\n[hooks]\nafter_create = '{mark}'\nbefore_agent = '{mark}'\n"
                      f"after_agent = '{mark}'\nbefore_remove = '{mark}'\ntimeout_s = 60\n")  # fmt: skip
    assert "before_remove" in user.json("info")["hooks"]
    sid = started(user, "Build it")
    user.ok("session", "execute", sid, "--agent", "coder")
    assert user.json("session", "show", sid)["state"] == "verifying"
    shown = user.ok("session", "logs", sid, "--hooks")  # the hooks' own log, as the operator reads it
    assert shown.count("=== ") >= 6 and "=== after_create" in shown and "=== after_agent" in shown
    worktree = Path(user.json("session", "show", sid)["worktree_path"])
    user.ok("session", "fire", sid, "cancel")
    assert not worktree.exists()
    assert marks.read_text().splitlines() == ["after_create ", "before_agent agent", "after_agent agent",
                                              "before_remove "]  # fmt: skip
    log = (user.repo / ".taskgate" / "data" / "agent-outputs" / sid / "hooks.log").read_text()
    assert [line.split()[1] for line in log.splitlines() if line.startswith("=== ") and ":" not in line.split()[1]] == [
        "after_create", "before_agent", "after_agent", "before_remove"]  # fmt: skip


def test_hooks_log_is_named_when_no_hook_ran(tmp_path: Path):
    user = User(fresh_repo(tmp_path / "shop"))
    user.ok("init")
    sid = started(user, "Build it")
    assert "has no hooks log: no hook ran" in user.fails("session", "logs", sid, "--hooks")
    assert "not with --follow" in user.run("session", "logs", sid, "--hooks", "--follow").stderr
