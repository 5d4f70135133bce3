"""What readying a worktree like the user's checkout costs: `.worktreeinclude` and a hook, against same-run baselines.

On a generated repository (`worktree_cost.py`'s: default 2,000 files over 200 commits) with `.env`, two local config
files and a git-ignored `node_modules/` of `--ignored` files (not listed, so only walked past), three figures:

1. **include**: `LocalWorktreeSetup.copy_included` (two git processes, then the copies) into a fresh worktree, against
   the baseline of that worktree's own `git worktree add`: the share set-up adds to creating a worktree.
2. **hook**: `run_hook("true")` (log header and footer, own process group, last line read back) against
   `subprocess.run(["/bin/sh", "-c", "true"])`: what taskgate adds around a hook.
3. **timeout**: a hook that starts a background child and waits, with `timeout_s` 0.5: seconds from the timeout
   to the whole process group gone (SIGTERM reaches both at once).

Run:  .venv/bin/python benchmarks/worktree_hooks.py [--iterations 20] [--files 2000] [--ignored 5000] [--tmp DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from worktree_cost import build_repo, git

from taskgate.infrastructure.worktree_setup import LocalWorktreeSetup


def prepare(repo: Path, ignored: int) -> None:
    (repo / ".gitignore").write_text(".env\nconfig/*.local.yml\nnode_modules/\n")
    (repo / ".worktreeinclude").write_text("# local files\n.env\nconfig/*.local.yml\n")
    git(repo, "add", ".gitignore", ".worktreeinclude")
    git(repo, "-c", "user.name=b", "-c", "user.email=b@example.invalid", "commit", "-q", "-m", "ignore")
    (repo / ".env").write_text("TOKEN=local\n")
    (repo / "config").mkdir()
    for name in ("db", "cache"):
        (repo / "config" / f"{name}.local.yml").write_text(f"{name}: local\n")
    modules = repo / "node_modules"
    for n in range(ignored):
        folder = modules / f"pkg{n % 100:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"f{n}.js").write_text("module.exports = 1\n")


async def include_figures(repo: Path, worktrees: Path, iterations: int) -> tuple[list[float], list[float]]:
    setup, creates, copies = LocalWorktreeSetup(), [], []
    for n in range(iterations):
        path = worktrees / f"wt{n}"
        begin = time.perf_counter()
        git(repo, "worktree", "add", "--quiet", "-b", f"bench/{n}", str(path), "main")
        creates.append(time.perf_counter() - begin)
        begin = time.perf_counter()
        done = await setup.copy_included(str(repo), str(path))
        copies.append(time.perf_counter() - begin)
        assert done.copied == [".env", "config/cache.local.yml", "config/db.local.yml"], done
        git(repo, "worktree", "remove", "--force", str(path))
        git(repo, "branch", "-D", f"bench/{n}")
    return creates, copies


async def hook_figures(cwd: Path, log: Path, iterations: int) -> tuple[list[float], list[float]]:
    setup, ours, base = LocalWorktreeSetup(), [], []
    for n in range(iterations):
        for who in ("ours", "base") if n % 2 else ("base", "ours"):
            begin = time.perf_counter()
            if who == "ours":
                result = await setup.run_hook("bench", "true", cwd=str(cwd), env={}, timeout_s=10, log_path=str(log))
                assert result.ok
                ours.append(time.perf_counter() - begin)
            else:
                subprocess.run(["/bin/sh", "-c", "true"], cwd=cwd, check=True, env={"PATH": os.environ["PATH"]})
                base.append(time.perf_counter() - begin)
    return ours, base


async def timeout_figure(cwd: Path, log: Path) -> tuple[float, bool]:
    pid_file = cwd / "child.pid"
    begin = time.perf_counter()
    result = await LocalWorktreeSetup().run_hook(
        "bench", f"sleep 300 & echo $! > {pid_file}; wait", cwd=str(cwd), env={}, timeout_s=0.5, log_path=str(log)
    )
    gone_after = time.perf_counter() - begin - 0.5
    child = int(pid_file.read_text())
    try:
        state = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        state = "gone"
    return gone_after, result.timed_out and state in ("gone", "Z")


def ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--commits", type=int, default=200)
    parser.add_argument("--ignored", type=int, default=5000)
    parser.add_argument("--tmp", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.tmp) as scratch:
        root = Path(scratch)
        repo, worktrees = root / "repo", root / "worktrees"
        build_repo(repo, args.files, args.commits)
        prepare(repo, args.ignored)
        worktrees.mkdir()
        creates, copies = await include_figures(repo, worktrees, args.iterations)
        ours, base = await hook_figures(root, root / "hooks.log", args.iterations * 5)
        gone_after, killed = await timeout_figure(root, root / "hooks.log")
    print(f"repository: {args.files} files, {args.commits} commits, {args.ignored} ignored files under node_modules/")
    print(f"include: copy_included median {ms(copies):.1f} ms (3 files) vs git worktree add {ms(creates):.1f} ms: "
          f"{ms(copies) / ms(creates):.2f}x of creating the worktree")  # fmt: skip
    ratio = ms(ours) / ms(base)
    print(f"hook:    run_hook('true') median {ms(ours):.2f} ms vs sh -c true {ms(base):.2f} ms: {ratio:.2f}x")
    print(f"timeout: process group gone {gone_after * 1000:.0f} ms after the 0.5 s timeout (child killed: {killed})")


if __name__ == "__main__":
    asyncio.run(main())
