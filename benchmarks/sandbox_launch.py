"""What the agent sandbox costs (issue 39): launch → first output, a build, bringing the commits home; and the
hostile attempts tried and refused.

Through taskgate's own pieces, no database: `BwrapSandboxes.prepare` (the session's private git dir brought up to
date, the plan: mounts, toolchain, network) and `SubprocessAgentRunner.start` (the `agent_exec` wrapper, the
network gate, the cgroup, bwrap, the in-sandbox init) on a linked worktree of a fresh repository, as a session has.

- **launch → first output**: from the start of `prepare` (sandboxed) or of `start` (bare) to the first byte in the
  agent's log: `python3 -c print` (the floor: what the sandbox adds, absolute), and with --claude the real
  Claude Code (`claude -p`, as the e2e tests install it) against the tests' scripted model server, to its first
  stream-json line. Ratio = sandboxed / bare, goal ≤ 1.1× for a real agent.
- **a build**: `python3 -m compileall -f -q` over 2,000 generated modules in the worktree, start to exit. Ratio =
  sandboxed / bare.
- **bring home**: `bring_back` after a commit made inside (fetch into refs/taskgate/incoming + compare-and-swap).
- **hostile**: tests/support/hostile_agent.py run once sandboxed: attempts tried, refused.

Baseline, same run: the same command unconfined, rounds interleaved (bare, sandboxed, bare, …). Medians of --rounds.

Run:  .venv/bin/python benchmarks/sandbox_launch.py [--rounds 7] [--claude]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from taskgate.domain.agents.kinds import AgentType  # noqa: E402
from taskgate.domain.entities import Session  # noqa: E402
from taskgate.domain.states import SessionState  # noqa: E402
from taskgate.infrastructure.agent_runner import SubprocessAgentRunner, exit_file  # noqa: E402
from taskgate.infrastructure.sandbox.sessions import BwrapSandboxes  # noqa: E402

HOSTILE = ROOT / "tests" / "support" / "hostile_agent.py"


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def session_in(root: Path) -> Session:
    """A fresh repository with a linked worktree on its own branch, as `session start` makes one."""
    repo = root / "repo"
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.name", "Bench")
    git(repo, "config", "user.email", "bench@example.invalid")
    (repo / "README.md").write_text("bench\n")
    git(repo, "add", "README.md")
    git(repo, "commit", "-q", "-m", "init")
    worktree = repo / ".worktrees" / "s1"
    git(repo, "worktree", "add", "-q", "-b", "feature/s1", str(worktree), "main")
    now = datetime.now(UTC)
    return Session("s1", "T-1", 1, None, None, SessionState.EXECUTING, 1, now, now, branch_name="feature/s1",
                   worktree_path=str(worktree))  # fmt: skip


async def first_output(
    runner, sandboxes, session, kind, command, env, log: Path, confined: bool
) -> tuple[float, float]:
    """(seconds to the first byte of output, seconds to the exit) of one run."""
    log.unlink(missing_ok=True)
    began = time.perf_counter()
    plan = await sandboxes.prepare(session, log.stem, kind, command, env, "") if confined else None
    await runner.start(command, session.worktree_path, env, str(log), sandbox=plan)
    first = None
    while not os.path.exists(exit_file(str(log))):
        if first is None and log.exists() and log.stat().st_size:
            first = time.perf_counter() - began
        await asyncio.sleep(0.002)
    if first is None:
        first = time.perf_counter() - began
    return first, time.perf_counter() - began


async def measure(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="tg-sandbox-bench-"))
    session = session_in(root)
    data = root / "data"
    sandboxes = BwrapSandboxes("bwrap", str(data), str(data / "agent-outputs"))
    (data / "agent-outputs" / session.id).mkdir(parents=True)
    runner = SubprocessAgentRunner()
    kind = AgentType("bench", ("python3",), network="none")
    logs = root / "logs"
    logs.mkdir()
    build_dir = Path(session.worktree_path or "") / "pkg"
    build_dir.mkdir()
    for index in range(2000):
        (build_dir / f"m{index}.py").write_text(f"def f{index}(x):\n    return [x * i for i in range({index % 50})]\n")
    cases = {"print": [sys.executable, "-c", "print('ready', flush=True)"],
             "build": [sys.executable, "-m", "compileall", "-f", "-q", str(build_dir)]}  # fmt: skip
    env = {"PYTHONDONTWRITEBYTECODE": "1"}
    figures: dict[str, dict[str, list[float]]] = {case: {"bare": [], "sandboxed": []} for case in cases}
    for round_ in range(args.rounds):
        for case, command in cases.items():
            for confined in (False, True):
                log = logs / f"{case}-{round_}-{int(confined)}.log"
                first, total = await first_output(runner, sandboxes, session, kind, command, env, log, confined)
                figures[case]["sandboxed" if confined else "bare"].append(first if case == "print" else total)
    if args.claude:
        figures["claude -p"] = await claude_rounds(args.rounds, runner, sandboxes, session, logs)
    home = await bring_home(sandboxes, session, args.rounds)
    tried, refused = await hostile(runner, sandboxes, session, logs)
    report(figures, home, tried, refused, args.rounds)


async def claude_rounds(rounds, runner, sandboxes, session, logs) -> dict[str, list[float]]:
    from tests.support.agent_clis import cli_path, user_variables
    from tests.support.model_server import ModelServer

    from taskgate.domain.agents.presets import PRESETS

    binary = cli_path("claude")
    out: dict[str, list[float]] = {"bare": [], "sandboxed": []}
    with ModelServer("ok") as model:
        env = user_variables("claude", model.url) | {"PATH": f"{binary.parent}:{os.environ['PATH']}"}
        kind = PRESETS["claude"].agent_type()
        command = [str(binary), "-p", "say hello", "--output-format", "stream-json", "--verbose"]
        for round_ in range(rounds):
            for confined in (False, True):
                log = logs / f"claude-{round_}-{int(confined)}.log"
                first, _ = await first_output(runner, sandboxes, session, kind, command, env, log, confined)
                out["sandboxed" if confined else "bare"].append(first)
    return out


async def bring_home(sandboxes, session, rounds: int) -> list[float]:
    """Seconds of `bring_back` after a commit made in the private git dir (as an agent inside makes it)."""
    times = []
    worktree = Path(session.worktree_path)
    private = worktree.parents[1] / ".git" / "taskgate-sandbox" / session.id / "git"  # beside the project's objects
    for index in range(rounds):
        (worktree / f"home-{index}.txt").write_text(f"{index}\n")
        env = {**os.environ, "GIT_DIR": str(private), "GIT_WORK_TREE": str(worktree)}
        subprocess.run(["git", "add", f"home-{index}.txt"], cwd=worktree, env=env, check=True)
        subprocess.run(["git", "commit", "-q", "-m", f"c{index}"], cwd=worktree, env=env, check=True)
        began = time.perf_counter()
        assert await sandboxes.bring_back(session)
        times.append(time.perf_counter() - began)
    return times


async def hostile(runner, sandboxes, session, logs) -> tuple[int, int]:
    """The hostile agent once, sandboxed: (attempts tried, refused)."""
    repo = Path(session.worktree_path).parents[1]
    other = repo.parent / "elsewhere"
    other.mkdir(exist_ok=True)
    second = repo / ".worktrees" / "s2"  # another session's worktree
    if not second.exists():
        git(repo, "worktree", "add", "-q", "-b", "feature/s2", str(second), "main")
    command = [sys.executable, str(HOSTILE), str(repo), str(other), str(Path.home()), str(second), "feature/s2", "1"]
    kind = AgentType("hostile", ("python3",))
    log = logs / "hostile.log"
    await first_output(runner, sandboxes, session, kind, command, {}, log, True)
    verdicts = re.findall(r"^ATTEMPT \S+: (\S+)", log.read_text(), re.M)
    return len(verdicts), verdicts.count("refused")


def report(figures, home, tried, refused, rounds) -> None:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())  # fmt: skip
    print(f"CPU: {cpu}, {os.cpu_count()} cores; bwrap sandbox; medians of {rounds} rounds, interleaved")
    print(f"{'case':<26}{'bare ms':>10}{'sandboxed ms':>15}{'ratio':>8}{'added ms':>10}")
    for case, runs in figures.items():
        bare, boxed = statistics.median(runs["bare"]) * 1000, statistics.median(runs["sandboxed"]) * 1000
        label = "launch → first output" if case in ("print", "claude -p") else "build: compileall 2,000"
        print(f"{label + ' (' + case + ')' if case != 'build' else label:<26}"[:26] + f"{bare:>10.1f}{boxed:>15.1f}"
              f"{boxed / bare:>7.2f}×{boxed - bare:>10.1f}  [{case}]")  # fmt: skip
    print(f"bring home (fetch + CAS) : {statistics.median(home) * 1000:.1f} ms median")
    print(f"hostile attempts tried: {tried}, refused: {refused}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--claude", action="store_true", help="also the real Claude Code against the model server")
    asyncio.run(measure(parser.parse_args()))


if __name__ == "__main__":
    main()
