#!/usr/bin/env python3
"""An agent that only waits: for timeouts, cancellation and process-group kills.

    sleeper.py [SECONDS] [--child] [--ignore-term]

It heartbeats and prints a line every second. `--child` also starts a child process that sleeps as long
(its pid goes to `sleeper-child.pid` in the session folder, so a test can check that the whole group was
killed); `--ignore-term` ignores SIGTERM, so only SIGKILL stops it.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from pathlib import Path

from _agentlib import FOLDER, heartbeat, say


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("seconds", nargs="?", type=float, default=3600.0)
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--ignore-term", action="store_true")
    args = parser.parse_args()
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.child:
        child = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({args.seconds})"])
        if FOLDER and Path(FOLDER).is_dir():
            (Path(FOLDER) / "sleeper-child.pid").write_text(f"{child.pid}\n")
        say(f"started child {child.pid}")
    deadline = time.monotonic() + args.seconds
    while (left := deadline - time.monotonic()) > 0:
        heartbeat()
        say(f"sleeping, {left:.0f} s left")
        time.sleep(min(1.0, left))
    say("woke up")
    return 0


if __name__ == "__main__":
    sys.exit(main())
