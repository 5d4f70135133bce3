#!/usr/bin/env python3
"""A scripted test agent: runs a test command in its worktree, saves a report, exits with the tests' status.

    scripted_tester.py [--report tests/report.txt] [--timeout 600] -- python -m pytest -q

The command is an argv list (no shell). The report (command, exit code, duration, the last lines of output)
goes into the session folder; the output's tail is printed too.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from _agentlib import heartbeat, save_output, say


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", default="tests/report.txt")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--tail", type=int, default=40, help="lines of output kept in the report")
    parser.add_argument("--prompt", default="", help="the step's prompt (a scripted agent only logs it)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the test command after --, e.g. -- python -m pytest -q")
    heartbeat()
    say(f"running {' '.join(command)}")
    started = time.monotonic()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout, check=False)
        code, output = done.returncode, done.stdout + done.stderr
    except FileNotFoundError:
        code, output = 127, f"command not found: {command[0]}\n"
    except subprocess.TimeoutExpired as exc:
        code, output = 124, f"timed out after {args.timeout} s\n{exc.stdout or ''}"
    seconds = time.monotonic() - started
    heartbeat()
    tail = "\n".join(output.splitlines()[-args.tail :])
    verdict = "passed" if code == 0 else "FAILED"
    report = f"command: {command}\nexit code: {code}\nduration: {seconds:.2f} s\nresult: {verdict}\n\n{tail}\n"
    say(f"tests {verdict} (exit {code}) in {seconds:.2f} s; report saved ({save_output(args.report, report)})")
    print(tail, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
