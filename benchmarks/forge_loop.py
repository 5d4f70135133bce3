"""What the forge loop costs and how fast it answers (issue 40): API calls per session, CI result → agent relaunched,
and a task from `taskgate init` to merged on the forge.

Through the e2e deployment (tests/e2e/test_forge_loop.py): a real `taskgate serve --http` on SQLite, the real CLI,
the fixer agent in the sandbox, the real smart-HTTP remote and the GitHub stand-in, whose request log is what is
counted. Each mode runs the same loop on a deployment of its own:

- **webhook**: the stand-in delivers signed webhooks to `/forge/webhook`; `poll_s` is 600 (no polling).
- **polling**: no webhooks; `poll_s` is 2 (the default is 30: calls scale with the time a pull request is open).

The loop: init → task → start → the fixer runs → approve (push, PR) → CI fails → the fixer runs again (the round)
→ CI green on its fix → the operator approves the merge → merged on the forge → completed.

- **API calls per session**: every request the stand-in answered during the loop (304s included, and how many).
- **CI result → agent relaunched**: from `set_check(failure)` to the round's agent row showing it started.
- **init → merged**: from `taskgate init` to the session completed, CI answering at once. Baseline, same run: the
  same steps with no `[forge]` (approve, then `session merge` locally).

Run:  .venv/bin/python benchmarks/forge_loop.py [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e.test_crash_points import CrashService  # noqa: E402
from tests.e2e.test_crash_recovery import connect, wait_for_session  # noqa: E402
from tests.e2e.test_forge_loop import ForgeService, until  # noqa: E402
from tests.e2e.test_mcp_transports import ok  # noqa: E402


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


async def one_loop(svc: ForgeService, task: str) -> dict[str, float]:
    """One session through the loop; its figures."""
    before = len(svc.github.calls)
    async with connect(svc) as client:
        sid = (await ok(client, "project_session_start", task_id=task))["id"]
        await ok(client, "session_execute", session_id=sid, agents=["fixer"])
        await wait_for_session(client, sid, "verify", lambda s: s["state"] == "verifying")
        svc.cli("session", "decide", sid, "approve", "--reason", "bench")
        number = _latest(svc)
        head = svc.github.pull(number)["head"]["sha"]
        failed_at = time.monotonic()
        svc.github.set_check(head, "lint", conclusion="failure", log="E501 line too long")
        await wait_for_session(client, sid, "relaunch", lambda s: any(a["run"] == 2 for a in s["agents"]))
        relaunched = time.monotonic() - failed_at
        fixed = await until("push the fix", lambda: _moved(svc, number, head))
        svc.github.set_check(fixed, "lint")
        await wait_for_session(client, sid, "ask for the merge", lambda s: s["state"] == "verifying")
        svc.cli("session", "decide", sid, "approve", "--reason", "bench")
        await wait_for_session(client, sid, "complete", lambda s: s["state"] == "completed")
    calls = svc.github.calls[before:]
    return {"calls": len(calls), "not_modified": sum(1 for c in calls if c[2] == 304), "relaunch_s": relaunched}


def _latest(svc: ForgeService) -> int:
    number = 1
    while True:
        try:
            svc.github.pull(number + 1)
        except Exception:  # no such pull request: the previous is the newest
            return number
        number += 1


def _moved(svc: ForgeService, number: int, old: str) -> str | None:
    head = svc.github.pull(number)["head"]["sha"]
    return head if head != old else None


async def init_to_merged(root: Path, forge: bool) -> float:
    """`taskgate init` → completed, CI green at once (with a forge) or a local merge (without)."""
    started = time.monotonic()
    svc: Any = ForgeService(root, None, webhooks=True) if forge else CrashService(root, None)
    if not forge:
        config = root / "config" / "taskgate.toml"
        script = root / "appender.py"
        config.write_text(config.read_text().replace("[agents.appender]", "[agents.fixer]", 1))
        assert script.exists()
    svc.seed("Bench")
    svc.start()
    try:
        async with connect(svc) as client:
            sid = (await ok(client, "project_session_start", task_id="DEMO-1"))["id"]
            await ok(client, "session_execute", session_id=sid, agents=["fixer"])
            await wait_for_session(client, sid, "verify", lambda s: s["state"] == "verifying")
            svc.cli("session", "decide", sid, "approve", "--reason", "bench")
            if forge:
                svc.github.set_check(svc.github.pull(1)["head"]["sha"], "lint")
            else:
                svc.cli("session", "merge", sid)
            await wait_for_session(client, sid, "complete", lambda s: s["state"] == "completed")
        return time.monotonic() - started
    finally:
        svc.stop()
        if forge:
            svc.close_all()


async def main(runs: int) -> None:
    print(f"forge loop, {runs} run(s); CPU: {cpu_model()}; Python {platform.python_version()}")
    for webhooks in (True, False):
        mode = "webhook" if webhooks else "polling (poll_s 2)"
        with tempfile.TemporaryDirectory(prefix="tg-forge-bench-") as tmp:
            svc = ForgeService(Path(tmp), None, webhooks=webhooks)
            if not webhooks:
                config = Path(tmp) / "config" / "taskgate.toml"
                config.write_text(config.read_text().replace("poll_s = 1\n", "poll_s = 2\n"))
            svc.seed(*(f"Bench {i}" for i in range(runs)))
            svc.start()
            try:
                figures = [await one_loop(svc, f"DEMO-{i + 1}") for i in range(runs)]
            finally:
                svc.stop()
                svc.close_all()
        calls = [f["calls"] for f in figures]
        print(f"{mode}: API calls per session {statistics.median(calls):.0f} (runs {calls}; 304s "
              f"{[f['not_modified'] for f in figures]}); CI result → agent relaunched "
              f"{statistics.median(f['relaunch_s'] for f in figures):.2f} s (runs "
              f"{[round(f['relaunch_s'], 2) for f in figures]})")  # fmt: skip
    ours, base = [], []
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="tg-forge-bench-") as a, tempfile.TemporaryDirectory() as b:
            ours.append(await init_to_merged(Path(a), forge=True))
            base.append(await init_to_merged(Path(b), forge=False))
    o, b_ = statistics.median(ours), statistics.median(base)
    print(f"init → merged on the forge {o:.1f} s vs init → merged locally {b_:.1f} s: {o / b_:.2f}× (runs "
          f"{[round(x, 1) for x in ours]} vs {[round(x, 1) for x in base]})")  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    asyncio.run(main(parser.parse_args().runs))
