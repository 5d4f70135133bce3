"""Agents on a user's own repository with nothing else running: the command that launches them serves them
taskgate's MCP tools, and `serve --http` says where it listens."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

from tests.e2e.test_cli import TASKGATE
from tests.e2e.test_init import User, fresh_repo


def started(user: User, title: str) -> str:
    user.ok("task", "add", title)
    return user.json("session", "start", user.json("task", "ready")[0]["id"])["id"]


def test_an_agent_saves_its_output_over_mcp_while_only_session_execute_runs(tmp_path: Path):
    user = User(fresh_repo(tmp_path / "shop"))
    user.ok("init")
    sid = started(user, "Build it")
    user.ok("session", "execute", sid, "--agent", "coder")  # the built-in scripted coder, through its MCP client
    outputs = user.json("session", "outputs", sid)
    assert [o["path"] for o in outputs["outputs"]] == ["coder/summary.md"]
    assert outputs["outputs"][0]["by"].startswith("agent")  # saved by save_output, not written beside it
    log = next(Path(outputs["folder"]).glob("*.log")).read_text()
    assert "summary saved (mcp)" in log and "Connection refused" not in log
    assert user.json("session", "show", sid)["state"] == "verifying"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_serve_http_says_where_it_listens_and_a_taken_port_is_one_line(tmp_path: Path):
    user = User(fresh_repo(tmp_path / "shop"))
    user.ok("init")
    port = free_port()
    server = subprocess.Popen([TASKGATE, "serve", "--http", "--port", str(port)], cwd=user.repo, env=user.env,
                              stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)  # fmt: skip
    try:
        assert server.stderr is not None
        seen = []  # start-up notes (whether dispatch is on) come before the line that says where it listens
        while len(seen) < 10 and not any("listening on" in x for x in seen):
            seen.append(server.stderr.readline())
        line = next((x for x in seen if "listening on" in x), "".join(seen))
        assert f"taskgate MCP server listening on http://127.0.0.1:{port}/mcp" in line
        assert "taskgate token create --operator" in line and ".taskgate/taskgate.toml" in line
        error = user.fails("serve", "--http", "--port", str(port))
        assert f"cannot listen on 127.0.0.1:{port}" in error and "--port" in error
    finally:
        server.terminate()
        server.wait(10)


def with_fake_cli(user: User, tmp_path: Path, name: str, version: str) -> None:
    """A stand-in `name` on PATH that prints `version` (what `agents list` and `doctor` read)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / name
    script.write_text(f"#!/bin/sh\necho '{version}'\n")
    script.chmod(0o755)
    user.env["PATH"] = f"{bin_dir}:{user.env['PATH']}"


def test_agents_list_says_what_is_installed_and_which_credentials_are_set(tmp_path: Path):
    user = User(fresh_repo(tmp_path / "shop"))
    user.ok("init")
    with_fake_cli(user, tmp_path, "claude", "2.1.0 (Claude Code)")
    user.env["ANTHROPIC_API_KEY"] = "sk-secret-value"
    user.env.pop("OPENAI_API_KEY", None)
    listed = {a["name"]: a for a in user.json("agents", "list")}
    assert listed["claude"]["installed"] and listed["claude"]["version"] == "2.1.0 (Claude Code)"
    assert listed["claude"]["ready"] and listed["claude"]["credentials_set"] == ["ANTHROPIC_API_KEY"]
    assert "sk-secret-value" not in user.ok("agents", "list", "--json")  # names only, never values
    assert listed["codex"]["ready"] is False and listed["aider"]["mcp"] == "none"
    assert listed["coder"]["source"] == "preset" and listed["coder"]["ready"]
    config = user.repo / ".taskgate" / "taskgate.toml"
    config.write_text(config.read_text() + '\n[agents.reviewer]\npreset = "claude"\ntimeout_s = 60\n')
    shown = user.json("agents", "show", "reviewer")
    assert shown["source"] == "preset+config" and shown["command"][:2] == ["claude", "-p"] and shown["timeout_s"] == 60
    assert shown["resume"] == ["--resume", "{conversation_id}"]  # how it continues its conversation on a rerun


def test_doctor_prints_one_line_per_check_and_fails_on_what_the_set_up_uses(tmp_path: Path):
    user = User(fresh_repo(tmp_path / "shop"))
    user.ok("init")
    out = user.ok("doctor")
    for check in ("git ", "config", "database", "project", "mcp endpoint", "agent claude"):
        assert check in out, out
    config = user.repo / ".taskgate" / "taskgate.toml"
    config.write_text(config.read_text().replace('# default_agents = ["claude"]', 'default_agents = ["codex"]'))
    user.env["PATH"] = "/usr/bin:/bin"  # no codex anywhere
    done = user.run("doctor")
    assert done.returncode == 1 and "FAIL agent codex" in done.stdout and "npm install -g @openai/codex" in done.stdout
    user.env |= {"HOME": str(tmp_path), "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}
    assert "FAIL git user.email" in user.run("doctor").stdout


def test_a_preset_whose_credentials_are_all_missing_is_refused_before_anything_is_written(tmp_path: Path):
    user = User(fresh_repo(tmp_path / "shop"))
    user.ok("init")
    with_fake_cli(user, tmp_path, "claude", "2.1.0 (Claude Code)")
    home = tmp_path / "home"
    home.mkdir()
    user.env["HOME"] = str(home)  # no ~/.claude login either
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_USE_BEDROCK", "CLAUDE_CODE_USE_VERTEX"):
        user.env.pop(name, None)
    sid = started(user, "Build it")
    before = user.json("session", "show", sid)
    error = user.fails("session", "execute", sid, "--agent", "claude")
    assert "agent type 'claude' needs one of ANTHROPIC_API_KEY" in error and "~/.claude/.credentials.json" in error
    assert user.json("session", "show", sid)["version"] == before["version"]
    assert user.json("session", "outputs", sid)["agents"] == []


def doctor(user: User) -> dict[str, dict]:
    """`doctor --json`'s checks by name (it exits 1 when another check, e.g. git's identity, fails)."""
    return {c["name"]: c for c in json.loads(user.run("doctor", "--json").stdout)}


def test_agents_list_and_doctor_say_ok_only_for_an_endpoint_the_cli_will_really_use(tmp_path: Path):
    """Codex ignores OPENAI_BASE_URL itself: taskgate writes it into the provider of the agent's private CODEX_HOME,
    which needs OPENAI_API_KEY too. An endpoint variable without its key is not ready; one that takes no connection
    is a warning; one that answers is ok, and doctor says what it checked."""
    user = User(fresh_repo(tmp_path / "shop"))
    user.ok("init")
    with_fake_cli(user, tmp_path, "codex", "codex-cli 0.169.0")
    user.env["HOME"] = str(tmp_path)  # no ~/.codex login
    config = user.repo / ".taskgate" / "taskgate.toml"
    config.write_text(config.read_text().replace('# default_agents = ["claude"]', 'default_agents = ["codex"]'))
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        url = f"http://127.0.0.1:{listening.getsockname()[1]}/v1"
        user.env |= {"OPENAI_BASE_URL": url}
        user.env.pop("OPENAI_API_KEY", None)
        codex = {a["name"]: a for a in user.json("agents", "list")}["codex"]
        assert codex["ready"] is False and "OPENAI_API_KEY" in codex["problem"]
        assert "codex: not ready: no credential: export OPENAI_API_KEY" in user.ok("agents", "list")
        user.env["OPENAI_API_KEY"] = "sk-secret-value"
        codex = {a["name"]: a for a in user.json("agents", "list")}["codex"]
        assert codex["ready"] and codex["problem"] is None
        assert codex["endpoint"].startswith(f"{url} (from OPENAI_BASE_URL), as the model provider taskgate writes")
        checks = doctor(user)
        assert checks["agent codex"]["status"] == "ok" and url in checks["agent codex"]["detail"]
    checks = doctor(user)  # nothing listens there any more
    assert checks["agent codex"]["status"] == "warn" and "does not answer" in checks["agent codex"]["detail"]


def test_a_launch_whose_endpoint_the_cli_would_not_use_is_refused_before_anything_is_written(tmp_path: Path):
    user = User(fresh_repo(tmp_path / "shop"))
    user.ok("init")
    with_fake_cli(user, tmp_path, "codex", "codex-cli 0.169.0")
    home = tmp_path / "home"
    (home / ".codex").mkdir(parents=True)
    (home / ".codex" / "auth.json").write_text("{}")  # logged in with Codex itself: its login is for OpenAI's API
    user.env |= {"HOME": str(home), "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"}
    user.env.pop("OPENAI_API_KEY", None)
    sid = started(user, "Build it")
    before = user.json("session", "show", sid)
    error = user.fails("session", "execute", sid, "--agent", "codex")
    assert "agent type 'codex': OPENAI_BASE_URL is set but OPENAI_API_KEY is not" in error
    assert user.json("session", "show", sid)["version"] == before["version"]
    assert user.json("session", "outputs", sid)["agents"] == []
