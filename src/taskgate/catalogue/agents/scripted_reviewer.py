#!/usr/bin/env python3
"""A scripted review agent: reads what the branch changed against its base and saves a review note.

    scripted_reviewer.py [--base main] [--require-commits]

The note (commits, diff stat, a verdict) goes to `review/<agent id>.md` in the session folder. With
`--require-commits` it exits 1 when the branch has no commit of its own.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from _agentlib import AGENT, heartbeat, save_output, say


def git(*args: str) -> str:
    done = subprocess.run(["git", *args], capture_output=True, text=True, check=False)
    return done.stdout.strip() if done.returncode == 0 else ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="main")
    parser.add_argument("--require-commits", action="store_true")
    parser.add_argument("--prompt", default="", help="the step's prompt (a scripted agent only logs it)")
    args = parser.parse_args()
    heartbeat()
    commits = git("log", "--oneline", f"{args.base}..HEAD").splitlines()
    stat = git("diff", "--stat", f"{args.base}...HEAD")
    verdict = "looks fine" if commits else "no commits on the branch yet"
    say(f"{len(commits)} commit(s) against {args.base}: {verdict}")
    lines = [f"# Review by {AGENT}", "", f"Verdict: {verdict}", "", "## Commits", ""]
    lines += [f"- {c}" for c in commits] or ["- none"]
    lines += ["", "## Diff stat", "", "```", stat or "(empty)", "```", ""]
    say(f"review saved ({save_output(f'review/{AGENT}.md', chr(10).join(lines))})")
    return 1 if args.require_commits and not commits else 0


if __name__ == "__main__":
    sys.exit(main())
