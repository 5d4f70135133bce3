"""A real console for browser tests: a user's repository set up with `taskgate init`, operators alice (admin) and
bob (developer: no approve permission), the built-in scripted coder as the default agent, and `taskgate serve
--http` on a free port. And the system Chromium, found or reported (CI must have it: TASKGATE_TEST_REQUIRE_BROWSER).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import make_git_repo

TASKGATE = str(Path(sys.executable).with_name("taskgate"))
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")


def chromium() -> str:
    """The system Chromium's path. Skips when there is none, except where the browser is required (CI)."""
    found = next((p for p in map(shutil.which, CHROMIUM_NAMES) if p), None)
    if found is None:
        if os.environ.get("TASKGATE_TEST_REQUIRE_BROWSER"):
            pytest.fail("Chromium is required here (TASKGATE_TEST_REQUIRE_BROWSER) and is not installed")
        pytest.skip("no Chromium: install Debian's `chromium` package (apt-get install chromium) to run these")
    return found


class ConsoleSite:
    """One deployment serving MCP and the console; `cli` runs taskgate in the repository as its user would."""

    def __init__(self, root: Path, database_url: str | None = None, **settings: str) -> None:
        """`settings`: extra TASKGATE_* environment variables (e.g. TASKGATE_WORKFLOWS__DEFAULT="bug-fix")."""
        self.root = root
        self.repo = make_git_repo(root / "repo")
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("TASKGATE_")} | {
            "TASKGATE_OPERATOR__DEFAULT": "alice",
            "GIT_AUTHOR_NAME": "taskgate", "GIT_AUTHOR_EMAIL": "taskgate@example.invalid",
            "GIT_COMMITTER_NAME": "taskgate", "GIT_COMMITTER_EMAIL": "taskgate@example.invalid",
        }  # fmt: skip
        if database_url:
            self.env["TASKGATE_DATABASE_URL"] = database_url
        self.env |= settings
        self.process: subprocess.Popen[bytes] | None = None
        self.tokens: dict[str, str] = {}

    def cli(self, *args: str) -> str:
        done = subprocess.run([TASKGATE, *args], cwd=self.repo, env=self.env, capture_output=True, text=True,
                              timeout=60)  # fmt: skip
        assert done.returncode == 0, f"taskgate {' '.join(args)} failed: {done.stderr}"
        return done.stdout

    def git(self, *args: str) -> str:
        return subprocess.run(["git", *args], cwd=self.repo, capture_output=True, text=True, check=True).stdout

    def seed(self, *titles: str) -> None:
        """init, the config the tests need, bob, one task per title (<KEY>-1 …), a token per operator."""
        self.cli("init", "--name", "shop")
        config = self.repo / ".taskgate" / "taskgate.toml"
        # the built-in scripted coder, 4 s slower, so that a browser surely sees the card while its agent works
        slow_coder = ["sh", "-c", 'sleep 4; exec "$0" "$@"', sys.executable,
                      "{catalogue_dir}/agents/scripted_coder.py", "{task_title}", "--instructions", "{instructions}",
                      "--prompt", "{prompt}"]  # fmt: skip
        text = config.read_text().replace("[execution]\n", '[execution]\ndefault_agents = ["coder"]\n', 1)
        config.write_text(text + f"\n[agents.coder]\ncommand = {json.dumps(slow_coder)}\n")
        self.env["TASKGATE_DATA_DIR"] = str(self.repo / ".taskgate" / "data")  # init's default, for db_rows
        self.cli("operator", "add", "bob", "--role", "developer")
        self.cli("plan", "add", "Phase 1")
        for title in titles:
            self.cli("task", "add", title, "--plan", "1")
        for who in ("alice", "bob"):
            self.tokens[who] = json.loads(self.cli("token", "create", "--operator", who, "--json"))["token"]

    def agent_token(self, session_id: str) -> str:
        return json.loads(self.cli("token", "create", "--agent", "--session", session_id, "--json"))["token"]

    def start(self) -> None:
        log = (self.root / "server.log").open("w")
        self.process = subprocess.Popen([TASKGATE, "serve", "--http", "--port", str(self.port)], cwd=self.repo,
                                        env=self.env, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.process.poll() is None, (self.root / "server.log").read_text()
            if "taskgate console at" in (self.root / "server.log").read_text():
                return
            time.sleep(0.1)
        raise AssertionError(f"the console did not start: {(self.root / 'server.log').read_text()}")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
            self.process = None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
