#!/usr/bin/env python3
"""An agent that fails: prints a reason, saves a note, and exits with status 3 (or `--code N`).

failing_agent.py [--code 3] [--message "why"]
"""

from __future__ import annotations

import argparse
import sys

from _agentlib import save_output, say


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code", type=int, default=3)
    parser.add_argument("--message", default="boom: this agent always fails")
    args = parser.parse_args()
    say(args.message)
    save_output("failure.txt", f"{args.message}\nexit code: {args.code}\n")
    return args.code


if __name__ == "__main__":
    sys.exit(main())
