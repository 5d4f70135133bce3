#!/usr/bin/env python3
"""A scripted coding agent: edits a file named after the task in its worktree and commits it.

    scripted_coder.py "{task_title}" [--instructions "{instructions}"] [--file PATH]

It writes (or, run again, appends to) `work/<slug of the title>.md`, commits it with a Conventional Commits
subject (`feat: <title>`, or `fix: address review` when instructions are given, as after request_changes),
and saves a summary into the session folder. No model: the same input always gives the same change.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from _agentlib import heartbeat, save_output, say, slug

GIT_IDENTITY = ["-c", "user.name=taskgate scripted agent", "-c", "user.email=agent@taskgate.invalid"]


def git(*args: str) -> str:
    done = subprocess.run(["git", *GIT_IDENTITY, *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"git {args[0]} failed: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout.strip()


def subject(kind: str, text: str) -> str:
    line = " ".join(text.split()) or "update"
    return f"{kind}: {line}"[:72].rstrip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("title", nargs="?", default="")
    parser.add_argument("--instructions", default="")
    parser.add_argument("--file", default="")
    parser.add_argument("--prompt", default="", help="the step's prompt (a scripted agent only logs it)")
    args = parser.parse_args()
    title = args.title or "untitled task"
    target = Path(args.file or f"work/{slug(title)}.md")
    if target.is_absolute() or ".." in target.parts:
        raise SystemExit(f"--file must stay inside the worktree: {target}")
    heartbeat()
    say(f"working on {title!r} in {Path.cwd()}")
    if args.prompt.strip():
        say(f"prompt: {args.prompt.strip().splitlines()[0][:100]}")
    target.parent.mkdir(parents=True, exist_ok=True)
    first = not target.exists()
    with target.open("a", encoding="utf-8") as out:
        if first:
            out.write(f"# {title}\n\nDone by the scripted coder.\n")
        if args.instructions.strip():
            out.write(f"\n## Changes requested\n\n{args.instructions.strip()}\n\nAddressed.\n")
        elif not first:
            out.write("\nAnother pass.\n")
    say(f"edited {target}")
    heartbeat()
    git("add", "--", str(target))
    message = subject("fix", "address review") if args.instructions.strip() else subject("feat", title)
    git("commit", "-q", "-m", message)
    head = git("rev-parse", "--short", "HEAD")
    say(f"committed {head}: {message}")
    saved = save_output("coder/summary.md", f"# {title}\n\n- edited `{target}`\n- commit {head}: {message}\n")
    say(f"summary saved ({saved})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
