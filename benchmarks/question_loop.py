"""The operator in the agent's loop, timed end to end with real processes: an agent's `ask_operator` call → the
operator notified (a real SMTP server, aiosmtpd; a real HTTP receiver, Apprise's json://) → the operator answers
from a terminal (`taskgate session answer`, a process of its own) → the agent's call returns with the answer.

taskgate runs as a user runs it: `taskgate init` in a fresh repository, `taskgate serve --http` (the agent's MCP
endpoint, the notifier under its lease), `[notify] batch_s = 0, interval_s = 0.1` (a question is worth telling at
once; the default batch_s = 10 batches bursts), `[questions] poll_s = 0.5` (the default). The agent is an MCP client
over streamable HTTP with its agent token, as any agent CLI is.

Same-run baselines: the notifier's share against a bare Apprise send is benchmarks/notify_latency.py's; here the
answer's delivery is set beside `taskgate session questions` (the start-up of a read command, what any answer from a
terminal pays) so the ratio is what delivery adds to typing the command.

Run:  .venv/bin/python benchmarks/question_loop.py [--n 5]   (~40 s)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_support import emit_row, git_repo
from notify_latency import Arrivals, http_server, smtp_server

TASKGATE = str(Path(sys.executable).with_name("taskgate"))


def _run(repo: Path, env: dict[str, str], *args: str) -> str:
    done = subprocess.run([TASKGATE, *args], cwd=repo, env=env, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"taskgate {' '.join(args)}: {done.stderr}")
    return done.stdout


def _set_up(root: Path, http_url: str, smtp_url: str) -> tuple[Path, dict[str, str], int]:
    repo = git_repo(root)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKGATE_")}
    _run(repo, env, "init")
    config = repo / ".taskgate" / "taskgate.toml"
    port = _free_port()
    channels = json.dumps([http_url, smtp_url])
    extra = f"\n[mcp]\nport = {port}\n\n[notify]\nchannels = {channels}\nbatch_s = 0\ninterval_s = 0.1\n"
    config.write_text(config.read_text() + extra)
    return repo, env, port


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _ask(url: str, token: str, question: str) -> tuple[dict, float]:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=300.0)) as http,
        Client(streamable_http_client(url, http_client=http), read_timeout_seconds=300) as client,
    ):
        result = await client.call_tool("ask_operator", {"question": question, "choices": ["red", "blue"]})
        return result.structured_content or {}, time.monotonic()


def _wait_arrival(arrivals: Arrivals, after: float, timeout_s: float = 30.0) -> float:
    """The first arrival at or after `after` (seconds, monotonic)."""
    deadline = time.monotonic() + timeout_s
    with arrivals.changed:
        while True:
            later = [at for at in arrivals.at.values() if at >= after]
            if later:
                return min(later)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no notification arrived")
            arrivals.changed.wait(left)


class Receiver:
    """Arrival times of any message on one channel (each message counted once, by its own arrival)."""

    def __init__(self) -> None:
        self.arrivals = Arrivals()
        self._n = 0

    def saw(self, _text: str) -> None:
        self._n += 1
        self.arrivals.saw(f"mark-{self._n}")


async def measure(n: int) -> None:
    http_rx, smtp_rx = Receiver(), Receiver()
    server, http_url = http_server(http_rx)  # type: ignore[arg-type]
    controller, smtp_url = smtp_server(smtp_rx)  # type: ignore[arg-type]
    rows: dict[str, list[float]] = {
        "ask→HTTP": [],
        "ask→SMTP": [],
        "answer→agent": [],
        "answer CLI": [],
        "read CLI": [],
    }
    with tempfile.TemporaryDirectory(prefix="taskgate-bench-questions-") as tmp:
        repo, env, port = _set_up(Path(tmp), http_url, smtp_url)
        log = (Path(tmp) / "serve.log").open("w")
        serve = subprocess.Popen([TASKGATE, "serve", "--http"], cwd=repo, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            await asyncio.sleep(3)
            for i in range(n):
                task = json.loads(_run(repo, env, "task", "add", f"Pick a colour {i}", "--json"))["id"]
                sid = json.loads(_run(repo, env, "session", "start", task, "--json"))["id"]
                token = json.loads(_run(repo, env, "token", "create", "--agent", "--session", sid, "--json"))["token"]
                began = time.monotonic()
                asking = asyncio.create_task(_ask(f"http://127.0.0.1:{port}/mcp", token, f"Which colour, {i}?"))
                http_at = await asyncio.to_thread(_wait_arrival, http_rx.arrivals, began)
                smtp_at = await asyncio.to_thread(_wait_arrival, smtp_rx.arrivals, began)
                answer_began = time.monotonic()
                await asyncio.to_thread(_run, repo, env, "session", "answer", sid, "blue")
                answer_done = time.monotonic()
                told, returned = await asyncio.wait_for(asking, 60)
                assert told.get("answer") == "blue", told
                read_began = time.monotonic()
                await asyncio.to_thread(_run, repo, env, "session", "questions")
                rows["read CLI"].append(time.monotonic() - read_began)
                rows["ask→HTTP"].append(http_at - began)
                rows["ask→SMTP"].append(smtp_at - began)
                rows["answer CLI"].append(answer_done - answer_began)
                rows["answer→agent"].append(returned - answer_began)
        finally:
            serve.terminate()
            serve.wait(timeout=15)
            controller.stop()
            server.shutdown()
    cpu = _cpu()
    print(f"# question loop, {n} rounds, {cpu}, {platform.python_version()}")
    for name, values in rows.items():
        print(f"{name:>14}: median {statistics.median(values):.3f} s (min {min(values):.3f}, max {max(values):.3f})")
    ratio = statistics.median(rows["answer→agent"]) / statistics.median(rows["read CLI"])
    print(f"answer typed → agent has it: {ratio:.2f}× a read command's run (the terminal's own start-up)")
    emit_row("question: answer typed → agent has it", statistics.median(rows["answer→agent"]),
             statistics.median(rows["read CLI"]), "s", "≤ read command + poll_s")  # fmt: skip


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5)
    asyncio.run(measure(parser.parse_args().n))


if __name__ == "__main__":
    main()
