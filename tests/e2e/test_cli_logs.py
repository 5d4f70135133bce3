"""`taskgate session logs` and the agent's report through the executable: a real agent process writes coloured
lines (and a title, a clipboard write) over about a second, then a Claude Code result line; `session logs
--follow` prints them as they come, without a single escape sequence, and returns when the agent ended;
`session status --json`, `session status` and `session review` show what the agent reported."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import make_git_repo
from tests.e2e.test_cli import TASKGATE, Cli, seed

# Prints line 0, waits for the test to say it saw it (a file), then prints lines 1-4 over ~1 s and its result.
STREAMER = r"""
import json, os, sys, time
marker = sys.argv[1]
def say(text):
    sys.stdout.write(text); sys.stdout.flush()
say("\x1b]0;owned\x07\x1b[31mline 0\x1b[0m [bold]not markup[/bold]\n")
deadline = time.time() + 60
while not os.path.exists(marker) and time.time() < deadline:
    time.sleep(0.05)
for i in range(1, 5):
    time.sleep(0.25)
    say(f"\x1b[2K\x1b]52;c;b3duZWQ=\x07line {i}\x1b[0m\r\n")
print("to stderr \x1b[H\x1b[2J", file=sys.stderr, flush=True)
say(json.dumps({"type": "result", "subtype": "success", "is_error": False, "num_turns": 3,
                "result": "Added the endpoint\nand a test", "total_cost_usd": 0.0125,
                "usage": {"input_tokens": 900, "output_tokens": 120, "cache_read_input_tokens": 50}}) + "\n")
"""
REPORT = {"final_message": "Added the endpoint\nand a test", "turns": 3, "input_tokens": 900, "output_tokens": 120,
          "cache_read_tokens": 50, "cost_usd": 0.0125, "is_error": False, "error": None}  # fmt: skip


@pytest.fixture
def streaming(tmp_path: Path) -> tuple[Cli, Path]:
    make_git_repo(tmp_path / "repo")
    script, marker = tmp_path / "streamer.py", tmp_path / "saw-line-0"
    script.write_text(STREAMER)
    command = json.dumps([sys.executable, str(script), str(marker)])
    config = tmp_path / "taskgate.toml"
    config.write_text(f'[agents.streamer]\ncommand = {command}\noutput_format = "claude-stream-json"\n')
    cli = Cli(tmp_path)
    cli.env["TASKGATE_CONFIG"] = str(config)
    seed(cli)
    return cli, marker


def lines_of(proc: subprocess.Popen, into: list[tuple[float, str]]) -> threading.Thread:
    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            into.append((time.monotonic(), line))

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    return thread


def test_session_logs_follows_an_agent_live_without_escapes_and_status_shows_its_report(streaming):
    cli, marker = streaming
    sid = cli.json("session", "start", "DEMO-1")["id"]
    execute = subprocess.Popen([TASKGATE, "session", "execute", sid[:8], "--agent", "streamer"], cwd=cli.workdir,
                               env=cli.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    follow = None
    try:
        deadline = time.monotonic() + 60
        # until the execute process has started it (the header below names its status when --follow starts; the
        # first agent of a CLI process waits queued while its MCP endpoint starts, about half a second)
        while [a["status"] for a in cli.json("session", "status", sid)["agents"]] != ["running"]:
            assert time.monotonic() < deadline and execute.poll() is None, execute.stderr and execute.stderr.read()
            time.sleep(0.2)
        follow = subprocess.Popen([TASKGATE, "session", "logs", sid[:8], "--follow"], cwd=cli.workdir, env=cli.env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        seen: list[tuple[float, bytes]] = []
        lines_of(follow, seen)
        while not any(b"line 0" in line for _, line in seen):
            assert time.monotonic() < deadline and follow.poll() is None, follow.stderr and follow.stderr.read()
            time.sleep(0.05)
        marker.write_text("go")  # lines 1-4 are written only now: --follow must print them as they come
        assert follow.wait(timeout=60) == 0, follow.stderr and follow.stderr.read()
        assert execute.wait(timeout=60) == 0, execute.stderr and execute.stderr.read()
    finally:
        for proc in (execute, follow):
            if proc is not None and proc.poll() is None:
                proc.kill()
    time.sleep(0.2)  # the reader thread drains the pipe
    out = b"".join(line for _, line in seen).decode()
    assert "\x1b" not in out and "\r" not in out and "\x07" not in out
    header, *body = out.splitlines()
    assert header.startswith("==> agent ") and " streamer (run 1, running): " in header and header.endswith(" <==")
    assert body[0] == "line 0 [bold]not markup[/bold]"
    assert body[1:5] == ["line 1", "line 2", "line 3", "line 4"] and "to stderr " in body
    assert body[-1] == "✓ done · 3 turns, 900 in / 120 out tokens, $0.0125"  # the result event, read for a person
    arrived = {line.decode().strip(): at for at, line in seen}
    assert arrived["line 4"] - arrived["line 1"] > 0.4  # printed as written (~0.75 s apart), not all at the end

    [agent] = cli.json("session", "status", sid)["agents"]
    assert agent["status"] == "completed" and agent["report"] == REPORT
    status = cli.ok("session", "status", sid[:8])
    assert (f"agent {agent['id'][:8]} streamer (run 1) completed: Added the endpoint "
            "(3 turns, 900 in / 120 out tokens (50 cached), $0.0125)") in status  # fmt: skip
    review = cli.ok("session", "review", sid[:8])
    assert f"agent {agent['id'][:8]} streamer (run 1) completed: Added the endpoint (3 turns" in review
    assert cli.json("session", "review", sid[:8])["agents"][0]["report"] == REPORT

    again = cli.ok("session", "logs", sid[:8], "--agent", "streamer")
    assert again.splitlines()[0].endswith(f"streamer (run 1, completed): {agent['output_path']} <==")
    assert "\x1b" not in again and again.splitlines()[1:6] == body[:5]
    assert cli.ok("session", "logs", sid[:8], "--agent", agent["id"][:6]) == again
    raw = subprocess.run([TASKGATE, "session", "logs", sid[:8], "--raw"], cwd=cli.workdir, env=cli.env,
                         capture_output=True, check=True)  # fmt: skip
    assert raw.stdout == Path(agent["output_path"]).read_bytes()  # into a pipe: the bytes as written, escapes too
    assert b"\x1b]0;owned\x07" in raw.stdout and raw.stderr.decode().startswith("==> agent ")
    on_terminal = on_a_terminal(cli, "session", "logs", sid[:8], "--raw")  # --raw on a terminal: made safe
    assert "line 4" in on_terminal and "owned" not in on_terminal and "\x1b]" not in on_terminal
    assert "    │ and a test" in status  # the whole final message under the agent's line
    error = cli.fails("session", "logs", sid[:8], "--agent", "nobody")
    assert "'nobody' is neither an agent id prefix nor an agent type" in error
    assert f"its agents: {agent['id'][:8]} streamer (run 1, completed)" in error


def on_a_terminal(cli, *args: str) -> str:
    """What `taskgate ARGS` prints with a terminal (a pseudo-terminal) as its stdout."""
    leader, follower = pty.openpty()
    env = {**cli.env, "TERM": "dumb", "NO_COLOR": "1"}
    done = subprocess.run([TASKGATE, *args], cwd=cli.workdir, env=env, stdout=follower, stderr=subprocess.DEVNULL,
                          timeout=60, check=True)  # fmt: skip
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the terminal's other end is closed and drained
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert done.returncode == 0
    return b"".join(chunks).decode(errors="replace")


def test_session_logs_of_a_session_without_agents_says_so(streaming):
    cli, _ = streaming
    sid = cli.json("session", "start", "DEMO-1")["id"]
    assert "has no agents yet" in cli.fails("session", "logs", sid[:8])
