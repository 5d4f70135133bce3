"""The REAL Claude Code, Codex and aider CLIs, offline against the scripted model server of the tests.

Each CLI is run as a subprocess in a fresh git repository with a minimal environment; the scripted
model makes it write hello.txt, commit it, call the MCP peer's `save_output` over streamable HTTP
with a bearer token, and end with "done". The CLIs come from npm (`tests/support/agent_clis.py`);
without Node.js 20 and npm these tests skip (fail under CI).

What was found to work (Claude Code 2.1.330, Codex 0.169.0), as root:

* Claude: `-p … --output-format stream-json --verbose --mcp-config F --strict-mcp-config
  --permission-mode acceptEdits --allowedTools Bash,…,mcp__taskgate__save_output`. MCP tools are
  deferred behind ToolSearch unless `ENABLE_TOOL_SEARCH=false`; `CLAUDE_CODE_MAX_RETRIES=0` turns
  off its retries (the default retries a 500 for minutes).
* Codex: `exec --json --skip-git-repo-check --sandbox workspace-write`, with every git dir added back by
  `--add-dir` (workspace-write keeps `.git` read-only, and in a linked worktree both
  `.git/worktrees/<name>` and the common `.git`; otherwise `git commit` fails with "index.lock:
  Read-only file system") and `mcp_servers.taskgate.default_tools_approval_mode="approve"` (else the
  MCP call fails: "requires approval, but approval policy is never"); `--sandbox danger-full-access`
  needs neither. The model provider taskgate writes for the codex preset (`codex_config`) in its CODEX_HOME, with
  `request_max_retries=0, stream_max_retries=0` added; the MCP server
  via `mcp_servers.taskgate.url` + `bearer_token_env_var`. Its MCP tools reach the model as a
  Responses `namespace` tool `mcp__taskgate` holding `save_output`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from taskgate.domain.agents.kinds import render_command
from taskgate.domain.agents.presets import PRESETS
from taskgate.domain.agents.quota import quota_error
from taskgate.domain.agents.reports import parse_report
from taskgate.domain.agents.setups import IGNORE_ALL, codex_config
from tests.support.agent_clis import require_cli
from tests.support.mcp_peer import McpPeer
from tests.support.model_server import FINAL_TEXT, INPUT_TOKENS, OUTPUT_TOKENS, SAVE_ARGUMENTS, ModelServer

PROMPT = "Write hello.txt, commit it, then save notes.md with the MCP tool save_output."
TOKEN = "peer-secret-token"
RUN_TIMEOUT = 120


@dataclass
class Workspace:
    root: Path
    repo: Path
    home: Path


def make_workspace(root: Path, *, worktree: bool = False) -> Workspace:
    """A fresh git repository (user.name/email set); with `worktree`, the agent works in a linked worktree of it."""
    repo, home = root / "repo", root / "home"
    home.mkdir()
    git = ["git", "-C", str(repo)]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "config", "user.name", "Test Agent"], check=True)
    subprocess.run([*git, "config", "user.email", "agent@example.invalid"], check=True)
    if worktree:
        subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "init"], check=True)
        subprocess.run([*git, "worktree", "add", "-q", "-b", "task", str(root / "worktree")], check=True)
        repo = root / "worktree"
    return Workspace(root, repo, home)


@pytest.fixture
def workspace(tmp_path: Path) -> Workspace:
    return make_workspace(tmp_path)


@pytest.fixture
def peer() -> Iterator[McpPeer]:
    with McpPeer(TOKEN) as served:
        yield served


def base_env(ws: Workspace) -> dict[str, str]:
    """PATH, a HOME of its own and a TMPDIR of its own (Claude Code puts claude-<uid>/ there)."""
    tmp = ws.root / "tmp"
    tmp.mkdir(exist_ok=True)
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(ws.home), "TMPDIR": str(tmp)}


def claude_command(
    ws: Workspace, server: ModelServer, peer: McpPeer, token: str = TOKEN
) -> tuple[list[str], dict[str, str]]:
    config = ws.root / "mcp.json"
    config.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "taskgate": {"type": "http", "url": peer.url, "headers": {"Authorization": f"Bearer {token}"}}
                }
            }
        )
    )
    argv = [
        str(require_cli("claude")),
        "-p",
        PROMPT,
        "--output-format",
        "stream-json",
        "--verbose",
        "--mcp-config",
        str(config),
        "--strict-mcp-config",
        "--permission-mode",
        "acceptEdits",
        "--allowedTools",
        "Bash,Edit,Write,Read,mcp__taskgate__save_output",
    ]
    runtime = ws.root / "run"
    runtime.mkdir(mode=0o700, exist_ok=True)
    env = base_env(ws)
    env_tmp = env["TMPDIR"]
    env |= {
        "ANTHROPIC_BASE_URL": server.url,
        "ANTHROPIC_API_KEY": "test",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "ENABLE_TOOL_SEARCH": "false",
        "CLAUDE_CODE_MAX_RETRIES": "0",
        "CLAUDE_CODE_TMPDIR": env_tmp,
        "XDG_RUNTIME_DIR": str(runtime),  # its cc-socks/<pid>.sock, else under /tmp
    }
    return argv, env


def git_dirs(repo: Path) -> list[str]:
    """The git directory of `repo` and, for a linked worktree, the common one it shares with the main checkout."""
    out = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--absolute-git-dir", "--git-common-dir"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return list(dict.fromkeys(str((repo / d).resolve()) for d in out))


def codex_command(
    ws: Workspace, server: ModelServer, peer: McpPeer, sandbox: str = "workspace-write", token: str = TOKEN
) -> tuple[list[str], dict[str, str]]:
    """workspace-write keeps every .git read-only: the git dirs are added back as writable roots, and MCP tool
    calls, which that mode would refuse under exec's `never` approval policy, are approved for this server."""
    if sandbox == "workspace-write":
        access = ["--sandbox", sandbox]
        for git_dir in git_dirs(ws.repo):
            access += ["--add-dir", git_dir]
        access += ["-c", 'mcp_servers.taskgate.default_tools_approval_mode="approve"']
    else:
        access = ["--sandbox", sandbox]
    codex_home = ws.root / "codex-home"
    codex_home.mkdir(exist_ok=True)
    # the provider taskgate writes for the codex preset, with the CLI's retries off (one request per failure)
    provider = codex_config(f"{server.url}/v1") + "request_max_retries = 0\nstream_max_retries = 0\n"
    (codex_home / "config.toml").write_text(provider)
    argv = [
        str(require_cli("codex")),
        "exec",
        "--json",
        "--skip-git-repo-check",
        *access,
        "-c",
        "model=gpt-5",  # its plain function tools (0.169's default model gets "code mode": the sessions test)
        "-c",
        f'mcp_servers.taskgate.url="{peer.url}"',
        "-c",
        'mcp_servers.taskgate.bearer_token_env_var="TASKGATE_TOKEN"',
        "-c",
        "mcp_servers.taskgate.required=true",  # a server that fails to start fails the run (else it goes on without)
        PROMPT,
    ]
    env = base_env(ws) | {"CODEX_HOME": str(codex_home), "OPENAI_API_KEY": "test", "TASKGATE_TOKEN": token}
    return argv, env


COMMANDS = {"claude": claude_command, "codex": codex_command}


def run(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT, stdin=subprocess.DEVNULL
    )


def json_lines(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip().startswith("{")]


def git_log(repo: Path) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "log", "--format=%s"], capture_output=True, text=True, check=False
    ).stdout


def assert_worked(ws: Workspace, server: ModelServer, peer: McpPeer, result: subprocess.CompletedProcess[str]) -> None:
    context = f"exit {result.returncode}\nstdout:\n{result.stdout[-4000:]}\nstderr:\n{result.stderr[-4000:]}"
    assert result.returncode == 0, context
    assert "feat: hello" in git_log(ws.repo).splitlines(), context
    assert (ws.repo / "hello.txt").read_text() == "hello"
    assert peer.calls == [SAVE_ARGUMENTS], context
    assert peer.authorizations and set(peer.authorizations) == {f"Bearer {TOKEN}"}
    assert peer.refused == []
    assert len(server.model_requests()) == 4, [r["path"] for r in server.requests]


def test_claude_code_writes_commits_and_calls_the_mcp_tool(workspace: Workspace, peer: McpPeer) -> None:
    with ModelServer("ok") as server:
        argv, env = claude_command(workspace, server, peer)
        result = run(argv, env, workspace.repo)
        assert_worked(workspace, server, peer, result)
    events = json_lines(result.stdout)
    assert events[0]["type"] == "system" and events[0]["subtype"] == "init"
    assert {"name": "taskgate", "status": "connected"}.items() <= events[0]["mcp_servers"][0].items()
    final = events[-1]
    assert final["type"] == "result" and final["is_error"] is False and final["subtype"] == "success"
    assert final["result"] == FINAL_TEXT
    assert final["num_turns"] == 4
    assert final["usage"]["input_tokens"] == 4 * INPUT_TOKENS
    assert final["usage"]["output_tokens"] == 4 * OUTPUT_TOKENS
    assert final["total_cost_usd"] > 0
    tool_uses = [
        block["name"]
        for event in events
        if event["type"] == "assistant"
        for block in event["message"]["content"]
        if block["type"] == "tool_use"
    ]
    assert tool_uses == ["Bash", "Bash", "mcp__taskgate__save_output"]


@pytest.mark.parametrize(
    ("sandbox", "worktree"),
    [("workspace-write", False), ("workspace-write", True), ("danger-full-access", False)],
    ids=["workspace-write", "workspace-write-in-worktree", "danger-full-access"],
)
def test_codex_writes_commits_and_calls_the_mcp_tool(
    sandbox: str, worktree: bool, tmp_path: Path, peer: McpPeer
) -> None:
    workspace = make_workspace(tmp_path, worktree=worktree)
    with ModelServer("ok") as server:
        argv, env = codex_command(workspace, server, peer, sandbox)
        result = run(argv, env, workspace.repo)
        assert_worked(workspace, server, peer, result)
    events = json_lines(result.stdout)
    assert events[0]["type"] == "thread.started"
    completed = [e["item"] for e in events if e["type"] == "item.completed"]
    assert [i["type"] for i in completed if i["type"] != "error"] == [
        "command_execution",
        "command_execution",
        "mcp_tool_call",
        "agent_message",
    ]
    mcp_call = next(i for i in completed if i["type"] == "mcp_tool_call")
    assert (mcp_call["server"], mcp_call["tool"], mcp_call["status"]) == ("taskgate", "save_output", "completed")
    assert completed[-1]["text"] == FINAL_TEXT
    final = events[-1]
    assert final["type"] == "turn.completed"
    assert final["usage"]["input_tokens"] == 4 * INPUT_TOKENS
    assert final["usage"]["output_tokens"] == 4 * OUTPUT_TOKENS


@pytest.mark.parametrize("cli", ["claude", "codex"])
@pytest.mark.parametrize("script", ["error500", "error429"])
def test_model_errors_end_the_run_with_a_non_zero_exit(
    cli: str, script: str, workspace: Workspace, peer: McpPeer
) -> None:
    with ModelServer(script) as server:
        argv, env = COMMANDS[cli](workspace, server, peer)
        started = time.monotonic()
        result = run(argv, env, workspace.repo)
        elapsed = time.monotonic() - started
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    assert elapsed < 60
    assert len(server.model_requests()) == 1  # retries are off
    assert git_log(workspace.repo) == ""
    final = json_lines(result.stdout)[-1]
    status = script.removeprefix("error")
    # the preset's quota patterns take the 429 for a quota wait (docs/budgets.md), and the 500 for a failure
    assert (quota_error(PRESETS[cli].quota_patterns, result.stdout) is not None) == (script == "error429"), [
        line for line in result.stdout.splitlines() if '"result"' in line or "error" in line
    ]
    if cli == "claude":
        assert final["type"] == "result" and final["is_error"] is True
        assert final["api_error_status"] == int(status)
    else:
        assert final["type"] == "turn.failed"
        assert final["error"]["message"]


@pytest.mark.parametrize("cli", ["claude", "codex"])
def test_a_hanging_model_keeps_the_cli_waiting_until_its_process_group_is_killed(
    cli: str, workspace: Workspace, peer: McpPeer
) -> None:
    with ModelServer("hang") as server:
        argv, env = COMMANDS[cli](workspace, server, peer)
        process = subprocess.Popen(
            argv,
            cwd=workspace.repo,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 30
            while not server.model_requests() and time.monotonic() < deadline:
                assert process.poll() is None, process.communicate(timeout=5)
                time.sleep(0.1)
            assert server.model_requests(), "the CLI never called the model"
            time.sleep(5)
            assert process.poll() is None
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate(timeout=10)
            assert process.returncode == -signal.SIGKILL
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.communicate(timeout=10)


def test_claude_code_with_a_refused_token_runs_on_without_the_mcp_tool(workspace: Workspace, peer: McpPeer) -> None:
    """No strict switch: the run exits 0; only the init event's `mcp_servers` status tells."""
    with ModelServer("ok") as server:
        argv, env = claude_command(workspace, server, peer, token="wrong")
        result = run(argv, env, workspace.repo)
    assert result.returncode == 0, result.stderr[-2000:]
    init = json_lines(result.stdout)[0]
    assert init["mcp_servers"] == [{"name": "taskgate", "status": "failed", "source": "dynamic"}]
    assert "mcp__taskgate__save_output" not in init["tools"]
    assert peer.calls == [] and peer.authorizations == [] and peer.refused
    assert set(peer.refused) == {"Bearer wrong"}


def test_codex_with_a_refused_token_fails_when_the_mcp_server_is_required(workspace: Workspace, peer: McpPeer) -> None:
    with ModelServer("ok") as server:
        argv, env = codex_command(workspace, server, peer, token="wrong")
        result = run(argv, env, workspace.repo)
        assert server.model_requests() == []
    assert result.returncode == 1
    assert "required MCP servers failed to initialize" in result.stderr
    assert peer.calls == [] and set(peer.refused) == {"Bearer wrong"}


def test_aider_as_the_preset_runs_it_commits_prints_its_usage_and_leaves_the_worktree_clean(
    workspace: Workspace,
) -> None:
    """The aider preset's own command (its history in another folder) in a worktree where taskgate made aider's
    tags cache ignored from inside: the commit is the only change git sees, and its usage line is what
    `output_format = "aider"` reads."""
    kind = PRESETS["aider"].agent_type()
    folder = workspace.root / "session"
    folder.mkdir()
    values = {"prompt": "Write hello.txt saying hello.", "session_folder": str(folder), "agent_id": "a1"}
    for name in kind.ignored:  # what taskgate's set-up writes before the agent starts
        (workspace.repo / name).mkdir()
        (workspace.repo / name / ".gitignore").write_text(IGNORE_ALL)
    subprocess.run(["git", "-C", str(workspace.repo), "commit", "-q", "--allow-empty", "-m", "init"], check=True)
    with ModelServer("ok") as server:
        argv = render_command(kind.command, values)
        env = base_env(workspace) | dict(kind.env) | {"OPENAI_API_KEY": "test", "OPENAI_API_BASE": f"{server.url}/v1"}
        result = run([str(require_cli("aider")), *argv[1:]], env, workspace.repo)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "feat: hello" in git_log(workspace.repo).splitlines()
    assert (workspace.repo / "hello.txt").read_text().strip() == "hello"
    status = subprocess.run(["git", "-C", str(workspace.repo), "status", "--porcelain", "--untracked-files=all"],
                            capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert status == "" and (workspace.repo / ".aider.tags.cache.v4" / "cache.db").exists()
    assert sorted(p.name for p in folder.iterdir()) == ["a1.aider.chat.history.md", "a1.aider.input.history"]
    report = parse_report(kind.output_format, result.stdout)
    assert report is not None and (report.turns, report.input_tokens, report.output_tokens) == (
        1,
        INPUT_TOKENS,
        OUTPUT_TOKENS,
    )
