"""From `taskgate init` to a session in verifying with each real agent CLI, and taskgate's own share of it.

For each CLI (the real Claude Code and Codex from npm, as the e2e tests install them; and the built-in scripted
coder, which needs no model), against the tests' scripted local model server, on a fresh git repository:

- **init → verifying**: the wall time of the user's commands `taskgate init`, `task add`, `session start`,
  `session execute --agent CLI` (which returns when the session is verifying);
- **launch → process start**: from the agent's `queued` event to its `started_at` (row, token, MCP endpoint up,
  config written, process spawned), read from the database;
- **end → recorded**: from the agent's `completed_at` to the `work_complete` transition into verifying;
- **CLI run**: `completed_at − started_at`, the CLI's own time inside taskgate.

Baseline, measured in the same run: the same CLI run directly (plain subprocess, same argv shape and model
server, its own git repository, no taskgate). Ratio = CLI run under taskgate / direct run. Medians of --rounds.

Run:  .venv/bin/python benchmarks/agent_clis.py [--rounds 3] [--cli claude codex coder]
"""

from __future__ import annotations

import argparse
import json
import os
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

from tests.support.agent_clis import cli_path  # noqa: E402
from tests.support.model_server import ModelServer  # noqa: E402

from taskgate.domain.agents.presets import PRESETS  # noqa: E402

TASKGATE = str(Path(sys.executable).with_name("taskgate"))
PROVIDER = ('model_providers.local={{{{name="local",base_url="{url}/v1",env_key="OPENAI_API_KEY",'
            'wire_api="responses",request_max_retries=0,stream_max_retries=0}}}}')  # fmt: skip


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


def fresh_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    git(path, "config", "user.name", "Bench")
    git(path, "config", "user.email", "bench@example.invalid")
    git(path, "commit", "-q", "--allow-empty", "-m", "init")
    return path


def environment(root: Path, cli: str, model: ModelServer) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKGATE_")}
    home = root / "home"
    home.mkdir(exist_ok=True)
    env |= {"HOME": str(home), "TMPDIR": str(root)}
    if cli in ("claude", "codex"):
        env["PATH"] = f"{cli_path(cli).parent}:{env['PATH']}"
    if cli == "claude":
        env |= {"ANTHROPIC_BASE_URL": model.url, "ANTHROPIC_API_KEY": "bench"}
    if cli == "codex":
        (home / ".codex").mkdir(exist_ok=True)
        env |= {"OPENAI_API_KEY": "bench", "CODEX_HOME": str(home / ".codex")}
    return env


def agent_table(cli: str, model: ModelServer) -> str:
    if cli == "claude":
        return '[agents.claude]\nenv = { CLAUDE_CODE_MAX_RETRIES = "0" }\n'
    if cli == "codex":
        command = list(PRESETS["codex"].command)
        command[2:2] = ["-c", PROVIDER.format(url=model.url), "-c", "model_provider=local", "-c", "model=gpt-5"]
        return f"[agents.codex]\ncommand = {json.dumps(command)}\n"
    return ""


def through_taskgate(root: Path, cli: str, model: ModelServer) -> dict[str, float]:
    repo = fresh_repo(root / "repo")
    env = environment(root, cli, model)

    def tg(*args: str) -> str:
        done = subprocess.run([TASKGATE, *args], cwd=repo, env=env, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise SystemExit(f"taskgate {' '.join(args)} failed: {done.stderr}")
        return done.stdout

    began = time.perf_counter()
    tg("init")
    config = repo / ".taskgate" / "taskgate.toml"
    config.write_text(config.read_text() + "\n" + agent_table(cli, model))
    task = json.loads(tg("task", "add", "Say hello", "--json"))["id"]
    sid = json.loads(tg("session", "start", task, "--json"))["id"]
    tg("session", "execute", sid, "--agent", cli)
    total = time.perf_counter() - began
    with sqlite3.connect(repo / ".taskgate" / "data" / "taskgate.db") as db:
        started, completed = db.execute("select started_at, completed_at from agents").fetchone()
        rows = db.execute("select payload, at from events where kind = 'agent.status'").fetchall()
        queued = min(at for payload, at in rows if json.loads(payload).get("to") == "queued")
        verifying = db.execute("select at from transition_log where to_state = 'verifying' and outcome = 'applied'"
                               ).fetchone()[0]  # fmt: skip
    t = {name: datetime.fromisoformat(str(v)) for name, v in
         (("queued", queued), ("started", started), ("completed", completed), ("verifying", verifying))}  # fmt: skip
    return {
        "init_to_verifying": total,
        "launch_to_start": (t["started"] - t["queued"]).total_seconds(),
        "end_to_recorded": (t["verifying"] - t["completed"]).total_seconds(),
        "cli_run": (t["completed"] - t["started"]).total_seconds(),
    }


def direct(root: Path, cli: str, model: ModelServer) -> float:
    """The same CLI, started straight in a git repository: no taskgate, no MCP server (the model's MCP call
    then has no tool to call, so the direct run is the shorter one: the baseline is generous to the CLI)."""
    repo = fresh_repo(root / "direct")
    env = environment(root, cli, model)
    prompt = "Work on task: Say hello"
    if cli == "claude":
        command = ["claude", "-p", prompt, "--output-format", "stream-json", "--verbose",
                   "--permission-mode", "acceptEdits", "--allowedTools", "Bash(git:*),Read,Edit,Write"]  # fmt: skip
        env["CLAUDE_CODE_MAX_RETRIES"] = "0"
    elif cli == "codex":
        command = ["codex", "exec", "--json", "--skip-git-repo-check", "--sandbox", "workspace-write", "--add-dir",
                   str(repo / ".git"), "-c", PROVIDER.format(url=model.url).replace("{{", "{").replace("}}", "}"),
                   "-c", "model_provider=local", "-c", "model=gpt-5", prompt]  # fmt: skip
    else:
        script = PRESETS["coder"].command[1].replace("{catalogue_dir}", str(ROOT / "src" / "taskgate" / "catalogue"))
        command = ["python3", script, "Say hello"]
    began = time.perf_counter()
    subprocess.run(command, cwd=repo, env=env, capture_output=True, stdin=subprocess.DEVNULL, timeout=300)
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cli", nargs="+", default=["coder", "claude", "codex"])
    args = parser.parse_args()
    print(f"{'cli':<7} {'init→verifying':>15} {'launch→start':>13} {'end→recorded':>13} {'CLI run':>9} "
          f"{'direct':>8} {'ratio':>6}")  # fmt: skip
    for cli in args.cli:
        runs, directs = [], []
        for _ in range(args.rounds):
            with tempfile.TemporaryDirectory() as tmp, ModelServer("ok") as model:
                runs.append(through_taskgate(Path(tmp) / "tg", cli, model))
                directs.append(direct(Path(tmp) / "plain", cli, model))
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        base = statistics.median(directs)
        print(f"{cli:<7} {med['init_to_verifying']:>13.2f} s {med['launch_to_start'] * 1000:>10.0f} ms "
              f"{med['end_to_recorded'] * 1000:>10.0f} ms {med['cli_run']:>7.2f} s {base:>6.2f} s "
              f"{med['cli_run'] / base:>5.2f}×")  # fmt: skip


if __name__ == "__main__":
    main()
