"""From `taskgate init` to the change merged on `main` with each preset as shipped, and taskgate's own share of it.

For each preset (the real Claude Code and Codex from npm and aider from PyPI, as the e2e tests install them, and the
built-in scripted coder, which needs no model), against the tests' scripted local model server, on a fresh git
repository, with nothing set but what a user exports (`tests/support/agent_clis.py: user_variables`: a key and the
endpoint; no agent table, no CLI config), the commands a user types, as the README lists them:

    taskgate init; git add .taskgate; git commit; taskgate task add; taskgate session start;
    taskgate session execute --agent PRESET; taskgate session decide approve; taskgate session merge

- **init → merged**: the wall time of those commands, and how many there are;
- **launch → start**: from the agent's `queued` event to its `started_at` (row, token, MCP endpoint up, its set-up
  written: Codex's CODEX_HOME, aider's ignored folder; process spawned), read from the database;
- **CLI run**: `completed_at − started_at`, the CLI's own time inside taskgate;
- **taskgate**: init → merged minus the CLI run: what the user waits for taskgate;
- and each command's seconds (`session execute` holds the CLI's run).

Baseline, measured in the same run: the scripted coder (same commands, no model, a Python script as the agent).
Ratios are a preset's figure over the coder's. Medians of --rounds, the rounds interleaved (coder, claude, codex,
aider, then again), so a load that comes and goes falls on all of them.

Run:  .venv/bin/python benchmarks/agent_clis.py [--rounds 3] [--preset coder claude codex aider]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.agent_clis import cli_path, user_variables  # noqa: E402
from tests.support.model_server import ModelServer  # noqa: E402

TASKGATE = str(Path(sys.executable).with_name("taskgate"))
CLIS = ("claude", "codex", "aider")


def fresh_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    for args in (
        ("init", "-q", "-b", "main"),
        ("config", "user.name", "Bench"),
        ("config", "user.email", "bench@example.invalid"),
        ("commit", "-q", "--allow-empty", "-m", "init"),
    ):
        subprocess.run(["git", *args], cwd=path, check=True, capture_output=True)  # fmt: skip
    return path


def environment(root: Path, preset: str, model: ModelServer) -> dict[str, str]:
    """The user's environment: theirs without TASKGATE_*, a HOME of its own, the CLI on PATH, its key and endpoint."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKGATE_")}
    home = root / "home"
    home.mkdir(exist_ok=True)
    env |= {"HOME": str(home), "TMPDIR": str(root)}
    if preset in CLIS:
        env["PATH"] = f"{cli_path(preset).parent}:{env['PATH']}"
    return env | user_variables(preset, model.url)


def init_to_merged(root: Path, preset: str, model: ModelServer) -> dict[str, float]:
    repo = fresh_repo(root / "repo")
    env = environment(root, preset, model)
    commands = 0
    each: dict[str, float] = {}  # seconds per command, by its words (`taskgate session execute`)

    def run(*argv: str) -> str:
        nonlocal commands
        commands += 1
        began = time.perf_counter()
        done = subprocess.run(argv, cwd=repo, env=env, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(argv[:4])} failed: {done.stderr[-2000:]}")
        words = [Path(argv[0]).name, *(a for a in argv[1:3] if a.isalpha())]
        each[" ".join(words)] = time.perf_counter() - began
        return done.stdout

    began = time.perf_counter()
    run(TASKGATE, "init")
    run("git", "add", ".taskgate")
    run("git", "commit", "-q", "-m", "Set up taskgate")
    task = json.loads(run(TASKGATE, "task", "add", "Say hello", "--json"))["id"]
    sid = json.loads(run(TASKGATE, "session", "start", task, "--json"))["id"]
    run(TASKGATE, "session", "execute", sid, "--agent", preset)
    run(TASKGATE, "session", "decide", sid, "approve", "--reason", "reviewed")
    run(TASKGATE, "session", "merge", sid)
    total, typed = time.perf_counter() - began, commands
    state = json.loads(run(TASKGATE, "session", "show", sid, "--json"))["state"]
    if state != "completed":
        raise SystemExit(f"{preset}: the session ended {state}, not completed")
    each.pop("taskgate session show", None)
    per_command = {f"cmd:{words}": seconds for words, seconds in each.items()}
    return {"commands": typed, "init_to_merged": total, **_agent_times(repo), **per_command}


def _agent_times(repo: Path) -> dict[str, float]:
    with sqlite3.connect(repo / ".taskgate" / "data" / "taskgate.db") as db:
        started, completed = db.execute("select started_at, completed_at from agents").fetchone()
        rows = db.execute("select payload, at from events where kind = 'agent.status'").fetchall()
    queued = min(at for payload, at in rows if json.loads(payload).get("to") == "queued")
    t = {name: datetime.fromisoformat(str(v)) for name, v in
         (("queued", queued), ("started", started), ("completed", completed))}  # fmt: skip
    return {"launch_to_start": (t["started"] - t["queued"]).total_seconds(),
            "cli_run": (t["completed"] - t["started"]).total_seconds()}  # fmt: skip


def _cpu() -> str:
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--preset", nargs="+", default=["coder", "claude", "codex", "aider"])
    args = parser.parse_args()
    presets = ["coder", *(p for p in args.preset if p != "coder")]  # the baseline first, in the same run
    print(f"{_cpu()}, {os.cpu_count()} CPUs; medians of {args.rounds} rounds; ratios against the scripted coder")
    print(f"{'preset':<7} {'cmds':>4} {'init→merged':>12} {'×coder':>7} {'launch→start':>13} {'×coder':>7} "
          f"{'CLI run':>8} {'taskgate':>9}")  # fmt: skip
    runs: dict[str, list[dict[str, float]]] = {preset: [] for preset in presets}
    for _ in range(args.rounds):  # rounds interleaved: a load that comes and goes falls on every preset alike
        for preset in presets:
            with tempfile.TemporaryDirectory() as tmp, ModelServer("ok") as model:
                runs[preset].append(init_to_merged(Path(tmp), preset, model))
    base = {k: statistics.median(r[k] for r in runs["coder"]) for k in runs["coder"][0]}
    for preset in presets:
        med = {k: statistics.median(r[k] for r in runs[preset]) for k in runs[preset][0]}
        print(f"{preset:<7} {med['commands']:>4.0f} {med['init_to_merged']:>10.2f} s "
              f"{med['init_to_merged'] / base['init_to_merged']:>6.2f}× {med['launch_to_start'] * 1000:>10.0f} ms "
              f"{med['launch_to_start'] / base['launch_to_start']:>6.2f}× {med['cli_run']:>6.2f} s "
              f"{med['init_to_merged'] - med['cli_run']:>7.2f} s")  # fmt: skip
    print("\nseconds per command (medians): " + ", ".join(presets))
    for key in (k for k in runs["coder"][0] if k.startswith("cmd:")):
        cells = "  ".join(f"{statistics.median(r[key] for r in runs[preset]):>6.2f}" for preset in presets)
        print(f"  {key.removeprefix('cmd:'):<26} {cells}")


if __name__ == "__main__":
    main()
