"""The deployment `tracker_dispatch.py` measures (it runs as `python benchmarks/tracker_dispatch.py`, so this imports
as `tracker_support`): one real `taskgate serve --http` node on SQLite in a fresh repository, reading GitHub Issues
from the stand-in (tests/support/github_api) or the built-in tracker, with `[dispatch]` on and a `task_ready`
workflow whose worker agent writes a start marker, holds until released, commits and writes an end marker. Built
like tests/e2e/test_tracker_dispatch.py's deployment, with one node, a per-task release and the caps as given."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.conftest import make_git_repo  # noqa: E402
from tests.e2e.test_cli import TASKGATE  # noqa: E402
from tests.e2e.test_mcp_transports import _free_port, _wait_until_listening, stop_server  # noqa: E402
from tests.support.github_api import GitHubStandIn  # noqa: E402

TOKEN = "ghp_trackerBenchToken0123456789"
WAIT_S = 180.0
# holds until `release-<task>` or `release-all` exists in the control folder, then commits its work
WORKER = """\
import subprocess, sys, time
from pathlib import Path
task_id, ctl = sys.argv[1], Path(sys.argv[2])
(ctl / f"start-{task_id}-{time.time_ns()}").write_text("")
while not (ctl / f"release-{task_id}").exists() and not (ctl / "release-all").exists():
    time.sleep(0.02)
Path("work.md").write_text(f"done {task_id}\\n")
identity = ["-c", "user.name=worker", "-c", "user.email=worker@taskgate.invalid"]
subprocess.run(["git", *identity, "add", "work.md"], check=True)
subprocess.run(["git", *identity, "commit", "-qm", f"feat: {task_id}"], check=True)
(ctl / f"end-{task_id}-{time.time_ns()}").write_text("")
"""
FLOW = """
id: tracker-flow
description: every ready task
triggers: [task_ready]
steps:
  - id: work
    type: agent
    agent: worker
    prompt: "do {{task.title}}"
"""


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


class Deployment:
    """Project `shop` in a fresh repository under `root`, one serve node on SQLite; `github`: read GitHub Issues
    from a stand-in (else the built-in tracker); `dispatch`: `[dispatch] auto_start` with `max_running`."""

    def __init__(self, root: Path, *, github: bool, max_running: int = 10, interval_s: float = 1.0,
                 dispatch: bool = True) -> None:  # fmt: skip
        self.root, self.ctl, self.interval_s = root, root / "ctl", interval_s
        self.ctl.mkdir()
        make_git_repo(root / "repo")
        self.github: GitHubStandIn | None = None
        tracker = ""
        q = json.dumps
        if github:
            bare = root / "shop.git"
            subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(bare)], check=True)
            self.github = GitHubStandIn(bare, token=TOKEN)
            self.github.start()
            tracker = f'[tracker]\nkind = "github"\n\n[tracker.github]\nrepository = "acme/shop"\n' \
                      f"api_url = {q(self.github.url)}\n\n"  # fmt: skip
        (root / "config" / "workflows" / "bench").mkdir(parents=True)
        (root / "config" / "workflows" / "bench" / "tracker-flow.yaml").write_text(FLOW)
        worker = root / "worker.py"
        worker.write_text(WORKER)
        self.port = _free_port()
        (root / "config" / "taskgate.toml").write_text(
            f"[sweeper]\ninterval_s = {interval_s}\n\n[execution]\nheartbeat_interval_s = 1\n\n"
            f"[dispatch]\nauto_start = {'true' if dispatch else 'false'}\nmax_running = {max_running}\n\n{tracker}"
            # operator_capacity counts sessions in verifying: on, dispatch would stop once alice's
            # max_active_sessions (10 here) await her decision, and 100 would never all reach verifying
            "[policies.operator_capacity]\nenabled = false\n\n"
            f'[agents.worker]\ncommand = [{q(sys.executable)}, {q(str(worker))}, "{{task_id}}", {q(str(self.ctl))}, '
            f'"{{prompt}}"]\ntimeout_s = 600\n\n[sandbox]\nwrite = [{q(str(self.ctl))}]\n'
        )  # fmt: skip
        base = {k: v for k, v in os.environ.items() if not k.startswith("TASKGATE_")}
        self.env = base | {"TASKGATE_CONFIG": str(root / "config" / "taskgate.toml"), "GITHUB_TOKEN": TOKEN,
                           "TASKGATE_OPERATOR__DEFAULT": "alice", "COLUMNS": "200",
                           "TASKGATE_DATA_DIR": str(root / "data"), "TASKGATE_NODE__ID": "node-1",
                           "TASKGATE_MCP__PORT": str(self.port),
                           # this worktree's taskgate in the CLI and serve too (the venv's install may point elsewhere)
                           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}  # fmt: skip
        self.process: subprocess.Popen[bytes] | None = None
        self.log = root / "serve.log"
        self.cli("init", "repo", "--name", "shop")

    def cli(self, *args: str) -> str:
        done = subprocess.run([TASKGATE, *args], cwd=self.root, env=self.env, capture_output=True, text=True,
                              timeout=120)  # fmt: skip
        if done.returncode not in (0, 4):
            raise RuntimeError(f"taskgate {' '.join(args)} failed ({done.returncode}): {done.stderr}")
        return done.stdout

    def json(self, *args: str) -> Any:
        return json.loads(self.cli(*args, "--json"))

    def start(self) -> None:
        with self.log.open("a") as out:
            self.process = subprocess.Popen(
                [TASKGATE, "serve", "--http", "--host", "127.0.0.1", "--port", str(self.port)], cwd=self.root,
                env=self.env, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
            )  # fmt: skip
        _wait_until_listening(self.process, self.port, self.log, timeout=60)

    def sessions(self) -> list[dict[str, Any]]:
        return self.json("session", "list", "--all")

    def starts(self) -> dict[str, int]:
        """Each agent's start marker: task id → time.time_ns() when it started."""
        return {p.name[6:].rsplit("-", 1)[0]: int(p.name.rsplit("-", 1)[1]) for p in self.ctl.glob("start-*")}

    def intervals(self) -> list[tuple[int, int]]:
        """Each agent run's (start, end) in ns from its markers (a run without an end: until now)."""
        ends = {p.name[4:].rsplit("-", 1)[0]: int(p.name.rsplit("-", 1)[1]) for p in self.ctl.glob("end-*")}
        return [(s, ends.get(t, time.time_ns())) for t, s in self.starts().items()]

    def release(self, task: str) -> None:
        (self.ctl / f"release-{task}").write_text("")

    def close(self) -> None:
        (self.ctl / "release-all").write_text("")
        if self.process is not None:
            stop_server(self.process)
            self.process = None
        if self.github is not None:
            self.github.stop()

    def until(self, what: str, check: Any, every_s: float = 0.05) -> Any:
        deadline = time.monotonic() + WAIT_S
        while not (found := check()):
            if time.monotonic() > deadline or (self.process is not None and self.process.poll() is not None):
                raise RuntimeError(f"did not {what} within {WAIT_S:.0f}s; serve's log:\n{self.log.read_text()[-3000:]}")
            time.sleep(every_s)
        return found


def most_at_once(intervals: list[tuple[int, int]]) -> int:
    edges = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    return peak


def timestamp_ns(iso: str) -> int:
    return int(datetime.fromisoformat(iso).timestamp() * 1e9)
