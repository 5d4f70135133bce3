"""Tokens a rerun spends when the agent continues its own conversation, against a fresh rerun (issue 42).

For each CLI (the real Claude Code and Codex from npm, as the e2e tests install them), on a fresh repository with
nothing set but what a user exports (a key and the endpoint), against the tests' scripted model server with
`measure=True` (each call's input tokens are its request's size: JSON characters / 4), the commands a user types:

    taskgate init; task add; session start; session execute --agent CLI;
    session decide request_changes --instructions "…"          ← the rerun measured

twice: with the preset as shipped (the rerun continues the first run's conversation: `--resume`, `exec resume`)
and with `[agents.CLI] resume = []` (the rerun starts afresh with the whole task and the revision note). Printed:
the first run's input tokens and calls, each rerun's, and resumed / fresh. Figures from the scripted server's
counts, not the CLI's (they agree; the server sees every call, titles and probes too).

What the ratio means: the scripted model answers from the tool results already in its conversation, so a
continued conversation has the earlier work in view and ends in one call, while a fresh run does the work again
(write, commit, save) with the CLI's whole system prompt and tool list each call, as a real model re-reads what it
needs. A real API bills a continued conversation's replayed prefix mostly as cache reads, which this count does not
discount: the saving in money is larger than in tokens.

Run:  .venv/bin/python benchmarks/resume_tokens.py [--cli claude codex]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.agent_clis import cli_path, user_variables  # noqa: E402
from tests.support.model_server import ModelServer  # noqa: E402

TASKGATE = str(Path(sys.executable).with_name("taskgate"))
INSTRUCTIONS = "Also write goodbye.txt"


def run(argv: list[str], repo: Path, env: dict[str, str]) -> str:
    done = subprocess.run(argv, cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:5])} failed: {done.stderr[-2000:]}")
    return done.stdout


def rerun_tokens(root: Path, cli: str, *, resume: bool) -> dict[str, int | str | None]:
    """The first run's and the rerun's input tokens and calls, as the scripted server counted them."""
    repo = root / "repo"
    repo.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKGATE_")}
    (root / "home").mkdir()
    env |= {"HOME": str(root / "home"), "TMPDIR": str(root), "PATH": f"{cli_path(cli).parent}:{env['PATH']}"}
    env["PYTHONPATH"] = str(ROOT / "src")  # this tree's taskgate, whatever the venv has installed
    for args in (
        ("init", "-q", "-b", "main"),
        ("config", "user.name", "Bench"),
        ("config", "user.email", "bench@example.invalid"),
        ("commit", "-q", "--allow-empty", "-m", "init"),
    ):
        run(["git", *args], repo, env)  # fmt: skip
    with ModelServer("ok", measure=True) as model:
        env |= user_variables(cli, model.url)
        run([TASKGATE, "init"], repo, env)
        if not resume:
            config = repo / ".taskgate" / "taskgate.toml"
            config.write_text(config.read_text() + f"\n[agents.{cli}]\nresume = []\n")
        run(["git", "add", ".taskgate"], repo, env)
        run(["git", "commit", "-q", "-m", "Set up taskgate"], repo, env)
        task = json.loads(run([TASKGATE, "task", "add", "Say hello", "--json"], repo, env))["id"]
        sid = json.loads(run([TASKGATE, "session", "start", task, "--json"], repo, env))["id"]
        run([TASKGATE, "session", "execute", sid, "--agent", cli], repo, env)
        first = list(model.model_requests())
        run([TASKGATE, "session", "decide", sid, "request_changes", "--reason", "more", "--instructions",
             INSTRUCTIONS], repo, env)  # fmt: skip
        rerun = model.model_requests()[len(first) :]
    status = json.loads(run([TASKGATE, "session", "status", sid, "--json"], repo, env))
    second = max(status["agents"], key=lambda a: a["run"])
    if status["state"] != "verifying" or second["status"] != "completed":
        raise SystemExit(f"{cli}: the rerun ended {second['status']}, the session {status['state']}")
    if bool(second["resumed_from"]) != resume:
        raise SystemExit(
            f"{cli}: resumed_from is {second['resumed_from']!r}, expected {'a conversation' if resume else None}"
        )
    return {"first": sum(r["input_tokens"] for r in first), "first_calls": len(first),
            "rerun": sum(r["input_tokens"] for r in rerun), "rerun_calls": len(rerun),
            "reported": (second.get("report") or {}).get("input_tokens")}  # fmt: skip


def _cpu() -> str:
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cli", nargs="+", default=["claude", "codex"], choices=["claude", "codex"])
    args = parser.parse_args()
    print(f"{_cpu()}, {os.cpu_count()} CPUs; input tokens = request JSON characters / 4 (scripted server's count)")
    print(f"{'CLI':<7} {'first run':>16} {'resumed rerun':>16} {'fresh rerun':>16} {'resumed / fresh':>16}")
    for cli in args.cli:
        figures = {}
        for resume in (True, False):
            with tempfile.TemporaryDirectory() as tmp:
                figures[resume] = rerun_tokens(Path(tmp), cli, resume=resume)
        resumed, fresh = figures[True], figures[False]
        ratio = resumed["rerun"] / fresh["rerun"] if fresh["rerun"] else float("nan")

        def cell(f: dict, key: str) -> str:
            return f"{f[key]:,} / {f[key + '_calls']}"

        print(f"{cli:<7} {cell(resumed, 'first'):>16} {cell(resumed, 'rerun'):>16} {cell(fresh, 'rerun'):>16} "
              f"{ratio:>15.2f}x")  # fmt: skip
        print(
            f"        (tokens / calls; the CLI's own report of the reruns: resumed {resumed['reported']}, "
            f"fresh {fresh['reported']} input tokens)"
        )
    print("resumed / fresh < 1: the continued conversation spent fewer input tokens than a fresh rerun")


if __name__ == "__main__":
    main()
