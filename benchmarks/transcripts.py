"""What reading an agent's log costs: its result at its end, and its log read for a person (CLI and console).

On a log made of a REAL Claude Code stream-json run (tests/data/agent_output/claude-plan.jsonl) repeated up to the
size asked, and on the real Codex run the same way:

- **final_message** on the last 512 KB (what the supervisor reads once when an agent ends);
- **readable_log** of the last 256 KB (what the console's session page renders per agent shown, up to 12, on each
  live refresh while agents run) and **Transcript** over the whole log (what `session logs` prints);

Baseline, same run: `json.loads` of every line of the same bytes (the parse any reader must do). Ratio = the
reader / the baseline. Medians of --rounds.

Run:  .venv/bin/python benchmarks/transcripts.py [--mb 8] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from taskgate.domain.agents.transcripts import Transcript, final_message  # noqa: E402
from taskgate.entrypoints.agent_lines import readable_log  # noqa: E402

DATA = ROOT / "tests" / "data" / "agent_output"


def timed(fn: Callable[[], object], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def baseline(text: str) -> None:
    for line in text.splitlines():
        if line.startswith("{"):
            json.loads(line)


def render_all(text: str) -> list[str]:
    transcript = Transcript()
    return transcript.feed(text) + transcript.end()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    for name, output_format in (("claude-plan.jsonl", "claude-stream-json"), ("codex-plan.jsonl", "codex-json")):
        measure(name, output_format, args.mb, args.rounds)


def measure(name: str, output_format: str, mb: float, rounds: int) -> None:
    """Print the three readers' medians against the json.loads baseline for one CLI's run, repeated to `mb`."""
    run = (DATA / name).read_text()
    text = run * max(1, int(mb * 1024 * 1024 / len(run)))
    end, window = text[-512 * 1024 :], text[-256 * 1024 :]
    with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as log:
        log.write(text)
    try:
        rows = [
            ("final_message, last 512 KB", timed(lambda: final_message(output_format, end), rounds),
             timed(lambda: baseline(end), rounds)),
            ("readable_log, last 256 KB (console)", timed(lambda: readable_log(log.name), rounds),
             timed(lambda: baseline(window), rounds)),
            (f"Transcript, whole {len(text) / 1e6:.1f} MB (session logs)", timed(lambda: render_all(text), rounds),
             timed(lambda: baseline(text), rounds)),
        ]  # fmt: skip
    finally:
        Path(log.name).unlink()
    print(f"{name} ({len(run)} bytes a run, {len(text.splitlines())} lines in all)")
    for what, took, base in rows:
        print(f"  {what:48} {took * 1000:8.2f} ms   json.loads baseline {base * 1000:8.2f} ms   "
              f"ratio {took / base:5.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
