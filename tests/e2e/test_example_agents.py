"""The shipped example agents (taskgate/catalogue/agents/), run as real processes as the supervisor runs them: in a
git worktree, with the TASKGATE_* environment, their arguments as single argv elements; and one of them saving
its output through a real `taskgate serve --http` with an agent token, as `taskgate session outputs` then shows."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import make_git_repo
from tests.e2e.test_mcp_transports import HttpServer, http_server  # noqa: F401 (the fixture)

AGENTS = Path(__file__).resolve().parents[2] / "src" / "taskgate" / "catalogue" / "agents"
SESSION = "6f1c0000-0000-4000-8000-0000000000aa"


def run_agent(script: str, *args: str, cwd: Path, folder: Path, env: dict[str, str] | None = None, timeout=60):
    environment = {k: v for k, v in os.environ.items() if not k.startswith("TASKGATE_")}
    environment |= {"TASKGATE_SESSION_ID": SESSION, "TASKGATE_TASK_ID": "DEMO-1",
                    "TASKGATE_SESSION_FOLDER": str(folder), "TASKGATE_AGENT_ID": "agent-1", **(env or {})}  # fmt: skip
    return subprocess.run([sys.executable, str(AGENTS / script), *args], cwd=cwd, env=environment,
                          capture_output=True, text=True, timeout=timeout, check=False)  # fmt: skip


@pytest.fixture
def worktree(tmp_path: Path) -> Path:
    repo = make_git_repo(tmp_path / "repo")
    subprocess.run(["git", "switch", "-q", "-c", "feature/DEMO-1"], cwd=repo, check=True)
    return repo


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    path = tmp_path / "agent-outputs" / SESSION
    path.mkdir(parents=True)
    return path


def git_log(repo: Path) -> list[str]:
    return subprocess.run(["git", "log", "--format=%s"], cwd=repo, capture_output=True, text=True).stdout.splitlines()


def test_the_coder_edits_a_file_named_after_the_task_and_commits_it(worktree, folder):
    title = 'Add a login page"; rm -rf ~ #'
    done = run_agent("scripted_coder.py", title, cwd=worktree, folder=folder)
    assert done.returncode == 0, done.stderr
    assert (worktree / "work" / "add-a-login-page-rm-rf.md").read_text().startswith(f"# {title}\n")
    assert git_log(worktree)[0] == f"feat: {title}"[:72].rstrip()
    assert "[scripted_coder] committed" in done.stdout
    assert (folder / "coder" / "summary.md").is_file() and (folder / "heartbeat-agent-1").is_file()
    again = run_agent("scripted_coder.py", title, "--instructions", "Use a form", cwd=worktree, folder=folder)
    assert again.returncode == 0 and git_log(worktree)[0] == "fix: address review"
    status = subprocess.run(["git", "status", "--porcelain"], cwd=worktree, capture_output=True, text=True).stdout
    assert status == ""


def test_the_tester_reports_and_exits_with_the_tests_status(worktree, folder):
    passing = run_agent("scripted_tester.py", "--", sys.executable, "-c", "print('3 passed')", cwd=worktree,
                        folder=folder)  # fmt: skip
    assert passing.returncode == 0 and "3 passed" in (folder / "tests" / "report.txt").read_text()
    failing = run_agent("scripted_tester.py", "--report", "t/fail.txt", "--", sys.executable, "-c",
                        "import sys; print('1 failed'); sys.exit(5)", cwd=worktree, folder=folder)  # fmt: skip
    assert failing.returncode == 5 and "exit code: 5" in (folder / "t" / "fail.txt").read_text()
    assert run_agent("scripted_tester.py", cwd=worktree, folder=folder).returncode == 2  # no command given


def test_the_reviewer_notes_the_branch_commits(worktree, folder):
    assert run_agent("scripted_coder.py", "Add a page", cwd=worktree, folder=folder).returncode == 0
    done = run_agent("scripted_reviewer.py", "--require-commits", cwd=worktree, folder=folder)
    assert done.returncode == 0, done.stderr
    note = (folder / "review" / "agent-1.md").read_text()
    assert "feat: Add a page" in note and "work/add-a-page.md" in note
    empty = make_git_repo(worktree.parent / "empty")
    assert run_agent("scripted_reviewer.py", "--require-commits", cwd=empty, folder=folder).returncode == 1


def test_the_failing_agent_exits_3(worktree, folder):
    done = run_agent("failing_agent.py", cwd=worktree, folder=folder)
    assert done.returncode == 3 and "boom" in done.stdout and (folder / "failure.txt").is_file()


def test_the_sleeper_and_its_child_die_with_their_process_group(worktree, folder):
    environment = {**os.environ, "TASKGATE_SESSION_FOLDER": str(folder), "TASKGATE_AGENT_ID": "sleepy"}
    command = [sys.executable, str(AGENTS / "sleeper.py"), "60", "--child", "--ignore-term"]
    process = subprocess.Popen(command, cwd=worktree, env=environment, stdout=subprocess.PIPE, start_new_session=True)
    pid_file = folder / "sleeper-child.pid"
    deadline = time.monotonic() + 20
    while not pid_file.is_file() or not pid_file.read_text().strip():
        assert time.monotonic() < deadline, "the sleeper never started its child"
        time.sleep(0.02)
    child = int(pid_file.read_text())
    os.killpg(process.pid, signal.SIGTERM)  # ignored by the sleeper...
    time.sleep(0.2)
    assert process.poll() is None
    os.killpg(process.pid, signal.SIGKILL)  # ...not this
    assert process.wait(timeout=10) == -signal.SIGKILL
    process.stdout.close()
    deadline = time.monotonic() + 10
    while _alive(child):
        assert time.monotonic() < deadline, "the child outlived its group"
        time.sleep(0.02)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (already dead, not yet reaped by init) counts as dead
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_an_agent_saves_its_output_over_mcp_with_its_token(http_server: HttpServer, tmp_path):  # noqa: F811
    env = {"TASKGATE_SESSION_ID": http_server.agent_session, "TASKGATE_MCP_URL": http_server.url,
           "TASKGATE_TOKEN": http_server.agent_token}  # fmt: skip
    done = run_agent("failing_agent.py", "--message", "over mcp", cwd=tmp_path, folder=tmp_path / "unused", env=env)
    assert done.returncode == 3 and "failed" not in done.stdout, done.stdout
    listed = json.loads(http_server.cli("session", "outputs", http_server.agent_session, "--json"))
    assert [o["path"] for o in listed["outputs"]] == ["failure.txt"]
    assert listed["outputs"][0]["by"] == f"agent:{http_server.agent_token_id}"
    assert Path(listed["folder"], "failure.txt").read_text().startswith("over mcp")
    table = http_server.cli("session", "outputs", http_server.agent_session[:8])
    assert "failure.txt" in table
    bad = {**env, "TASKGATE_TOKEN": "tg_not-a-token"}
    fallback = run_agent("failing_agent.py", cwd=tmp_path, folder=tmp_path / "fallback", env=bad)
    assert "writing into the session folder instead" in fallback.stdout
    assert (tmp_path / "fallback" / "failure.txt").is_file()


class DyingMcpServer:
    """A local HTTP server that speaks just enough MCP (initialize, the initialized notification) and then dies in
    the middle of its reply to tools/call, as `mode` says: headers and part of a Content-Length body, part of a
    chunked body, headers alone, part of a body and then a TCP reset, or nothing at all. `calls` counts the
    tools/call replies it broke off."""

    BODY = json.dumps({"jsonrpc": "2.0", "id": 2, "result": {"content": [], "structuredContent": {"ok": True}}})

    def __init__(self, mode: str) -> None:
        self.mode, self.calls, self.stop = mode, 0, threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.05)  # closing a socket does not wake a thread blocked in accept()
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/mcp"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        self.listener.close()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                connection, _ = self.listener.accept()
            except TimeoutError:
                continue
            with connection:
                connection.settimeout(10)
                self._answer(connection)

    def _answer(self, connection: socket.socket) -> None:
        stream = connection.makefile("rb")
        headers = {}
        stream.readline()  # the request line
        while (line := stream.readline().strip()) != b"":
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        message = json.loads(stream.read(int(headers["content-length"])))
        if message.get("method") == "initialize":
            info = {"name": "dying", "version": "1"}
            result = {"protocolVersion": "2025-06-18", "capabilities": {}, "serverInfo": info}
            body = json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result})
            connection.sendall(self._head(len(body), "Mcp-Session-Id: s1\r\n") + body.encode())
        elif "id" not in message:  # the initialized notification
            connection.sendall(b"HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        else:
            self.calls += 1
            self._die(connection)

    def _die(self, connection: socket.socket) -> None:
        body = self.BODY.encode()
        if self.mode == "no status line":
            return  # closed unanswered: the client reads RemoteDisconnected
        if self.mode == "chunked":
            head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
            connection.sendall(head + f"{len(body):x}\r\n".encode() + body[:20])
        elif self.mode == "headers only":
            connection.sendall(self._head(len(body)))
        else:
            connection.sendall(self._head(len(body)) + body[:20])
        if self.mode == "reset":  # SO_LINGER 0: close sends RST instead of FIN
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    @staticmethod
    def _head(length: int, extra: str = "") -> bytes:
        return (f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n{extra}"
                "Connection: close\r\n\r\n").encode()  # fmt: skip


@pytest.mark.parametrize("mode", ["content-length", "chunked", "headers only", "reset", "no status line"])
def test_the_coder_survives_an_mcp_server_that_dies_mid_reply(worktree, folder, mode):
    """A server that dies while answering save_output is a transient failure like one that is not there: the
    agent writes its output into the session folder itself and finishes its work."""
    server = DyingMcpServer(mode)
    try:
        env = {"TASKGATE_MCP_URL": server.url, "TASKGATE_TOKEN": "tg_agent"}
        done = run_agent("scripted_coder.py", "Add a login page", cwd=worktree, folder=folder, env=env)
    finally:
        server.close()
    assert server.calls == 1, done.stdout + done.stderr
    assert done.returncode == 0, done.stderr
    assert "writing into the session folder instead" in done.stdout and "summary saved (file)" in done.stdout
    assert (folder / "coder" / "summary.md").read_text().startswith("# Add a login page")
    assert git_log(worktree)[0] == "feat: Add a login page"
