"""How fast a stalled agent is found, and how fast a stop ends an agent's process group (issue 38).

Through taskgate's own process runner (`SubprocessAgentRunner`: the `agent_exec` wrapper, its own process group, the
stall watch reading the log as it grows), no database:

- **stall detected after**: an agent that prints only retry notices (a script printing Codex's `Reconnecting...
  waiting for network` every 0.2 s; and, when installed as the e2e tests install them, the real Codex, Claude Code
  and aider pointed at a closed port, with their presets' `stall_patterns`), from its start to the stall, against
  `stall_s` (ratio = detected / stall_s; a CLI's start-up lines count as progress, so it is > 1 by their time);
- **stop → group gone**: `AgentRunner.end` (what every stop uses, from any process) on a sleeper with a child,
  which obeys SIGTERM, and on one that ignores it (SIGKILL after the grace, `--grace`), from the call to the moment
  no process of the group is left; with --real-clis also each real CLI, 3 s into retrying a closed port.

Baseline, same run: `os.killpg(SIGKILL)` on the same sleeper group and a plain wait until its members are gone
(the floor of any stop). Ratio = stop / floor. Medians of --rounds.

Run:  .venv/bin/python benchmarks/agent_stop.py [--rounds 5] [--stall-s 2] [--grace 2] [--real-clis [--cli-stall-s 20]]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from taskgate.application.agents.ports import Watching  # noqa: E402
from taskgate.domain.agents.presets import PRESETS  # noqa: E402
from taskgate.domain.agents.stalls import ProgressWatch  # noqa: E402
from taskgate.infrastructure import process_groups  # noqa: E402
from taskgate.infrastructure.agent_runner import SubprocessAgentRunner  # noqa: E402

SLEEPER = ROOT / "src/taskgate/catalogue/agents/sleeper.py"
RETRIER = (
    "import time\nwhile True:\n"
    '    print(\'{"type":"error","message":"Reconnecting... waiting for network"}\', flush=True)\n'
    "    time.sleep(0.2)\n"
)
CACHE = Path(os.environ.get("TASKGATE_TEST_CACHE", Path.home() / ".cache/taskgate-tests"))
CLOSED = "http://127.0.0.1:9"  # nothing listens on the discard port here


def real_clis(folder: Path) -> dict[str, tuple[list[str], dict[str, str]]]:
    """The real CLIs the e2e tests installed, each pointed at a closed port (skipped when not installed)."""
    npm, aider = CACHE / "npm/node_modules/.bin", CACHE / "aider-venv/bin/aider"
    home = folder / "home"
    home.mkdir(exist_ok=True)
    found = {
        "claude": ([str(npm / "claude"), "-p", "hi", "--output-format", "stream-json", "--verbose"],
                   {"ANTHROPIC_API_KEY": "x", "ANTHROPIC_BASE_URL": CLOSED, "HOME": str(home)}),
        "codex": ([str(npm / "codex"), "exec", "--json", "--skip-git-repo-check", "hi"],
                  {"OPENAI_API_KEY": "x", "OPENAI_BASE_URL": f"{CLOSED}/v1", "CODEX_HOME": str(home / "codex")}),
        "aider": ([str(aider), "--model", "openai/gpt-4o", "--message", "hi", "--yes-always", "--no-pretty",
                   "--no-stream", "--no-check-update", "--no-analytics", "--no-show-release-notes",
                   "--no-show-model-warnings", "--no-gitignore"],
                  {"OPENAI_API_KEY": "x", "OPENAI_API_BASE": f"{CLOSED}/v1", "HOME": str(home),
                   "LITELLM_LOCAL_MODEL_COST_MAP": "True"}),
    }  # fmt: skip
    (home / "codex").mkdir(exist_ok=True)
    return {name: spec for name, spec in found.items() if Path(spec[0][0]).exists()}


async def stall_after(command: list[str], env: dict[str, str], patterns: tuple[str, ...], stall_s: float,
                      folder: Path) -> float:  # fmt: skip
    """Seconds from the agent's start to its stall (the runner then stops it). Exits when the stall came before
    any retry notice (a CLI still starting up) or the agent ended some other way."""
    runner, log = SubprocessAgentRunner(), str(folder / f"stall-{time.monotonic_ns()}.log")
    loop = asyncio.get_running_loop()
    start = loop.time()
    pid = await runner.start(command, str(folder), env, log)
    seen: list[float] = []

    async def on_stall(why: str) -> None:
        seen.append(loop.time())

    watch = ProgressWatch(stall_s, patterns, loop.time())
    watching = Watching(3600, 10**9, 2.0, watch, on_stall=on_stall)
    ended = await runner.wait(pid, output_path=log, watching=watching, stop=asyncio.Event(), beat=_nothing,
                              beat_every_s=3600, started=runner.process_start(pid))  # fmt: skip
    if ended.reason != "stalled" or watch.last_retry is None:
        why = "stalled before any retry notice" if ended.reason == "stalled" else f"ended {ended.reason}"
        raise SystemExit(f"{command[0]}: {why} ({ended.exit_code}); raise --cli-stall-s? {ended.output_tail}")
    return seen[0] - start


async def stop_time(ignore_term: bool, grace: float, folder: Path, *, floor: bool = False) -> tuple[float, str]:
    """Seconds from the stop to the group gone, and the signal that ended it."""
    runner = SubprocessAgentRunner()
    env = {"TASKGATE_SESSION_FOLDER": str(folder), "TASKGATE_AGENT_ID": "bench"}
    pid_file = folder / "sleeper-child.pid"
    pid_file.unlink(missing_ok=True)
    command = [sys.executable, str(SLEEPER), "600", "--child", *(["--ignore-term"] if ignore_term else [])]
    pid = await runner.start(command, str(folder), env, str(folder / "stop.log"))
    while not pid_file.exists() or len(process_groups.members(pid)) < 3:
        await asyncio.sleep(0.01)
    began = time.perf_counter()
    if floor:
        os.killpg(pid, signal.SIGKILL)
        await process_groups.wait_gone(pid, 30)
        took, how = time.perf_counter() - began, "SIGKILL"
    else:
        ended = await runner.end(pid, runner.process_start(pid), grace)
        took, how = time.perf_counter() - began, str(ended.signal)
    await runner.end(pid, None, 0.1)  # reap
    return took, how


async def stop_cli(command: list[str], env: dict[str, str], grace: float, folder: Path) -> tuple[float, str]:
    """A real CLI retrying a closed port for 3 s, then stopped: seconds to its group gone, and the signal."""
    runner = SubprocessAgentRunner()
    pid = await runner.start(command, str(folder), env, str(folder / f"cli-{time.monotonic_ns()}.log"))
    await asyncio.sleep(3)
    began = time.perf_counter()
    ended = await runner.end(pid, runner.process_start(pid), grace)
    return time.perf_counter() - began, str(ended.signal)


async def _nothing() -> None:
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--stall-s", type=float, default=2.0)
    parser.add_argument("--grace", type=float, default=2.0)
    parser.add_argument("--real-clis", action="store_true", help="also the real CLIs, if installed")
    # aider prints nothing for seconds while it starts: a shorter stall_s finds it stalled before its first retry
    parser.add_argument("--cli-stall-s", type=float, default=20.0, help="the real CLIs' stall_s")
    args = parser.parse_args()
    asyncio.run(run(args))


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        subprocess.run(["git", "init", "-q", str(folder)], check=True)
        retrier = folder / "retrier.py"
        retrier.write_text(RETRIER)
        codex_patterns = PRESETS["codex"].stall_patterns
        print(f"stall detected after (stall_s = {args.stall_s:g} s), medians of {args.rounds}:")
        stalls = [await stall_after([sys.executable, str(retrier)], {}, codex_patterns, args.stall_s, folder)
                  for _ in range(args.rounds)]  # fmt: skip
        _line("retry-only script", statistics.median(stalls), args.stall_s)
        if args.real_clis:
            for name, (command, env) in real_clis(folder).items():
                took = await stall_after(command, env, PRESETS[name].stall_patterns, args.cli_stall_s, folder)
                _line(f"{name} (closed port, stall_s {args.cli_stall_s:g} s)", took, args.cli_stall_s)
        print(f"\nstop → process group gone (grace {args.grace:g} s), medians of {args.rounds}:")
        floor = statistics.median([(await stop_time(False, args.grace, folder, floor=True))[0]
                                   for _ in range(args.rounds)])  # fmt: skip
        print(f"  {'baseline: killpg(SIGKILL) + wait':<40} {floor * 1000:8.1f} ms")
        for label, ignore in (("obeys SIGTERM", False), ("ignores SIGTERM", True)):
            runs = [await stop_time(ignore, args.grace, folder) for _ in range(args.rounds)]
            took = statistics.median(t for t, _ in runs)
            signals = ",".join(sorted({s for _, s in runs}))
            print(f"  {label + ' (' + signals + ')':<40} {took * 1000:8.1f} ms  ({took / floor:.1f}x baseline)")
        if args.real_clis:
            for name, (command, env) in real_clis(folder).items():
                took, how = await stop_cli(command, env, args.grace, folder)
                label = f"{name}, retrying ({how}, one run)"
                print(f"  {label:<40} {took * 1000:8.1f} ms  ({took / floor:.1f}x baseline)")


def _line(label: str, took: float, stall_s: float) -> None:
    print(f"  {label:<44} {took:6.2f} s  ({took / stall_s:.2f}x stall_s)")


if __name__ == "__main__":
    main()
