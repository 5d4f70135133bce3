"""Cost of one session worktree cycle through taskgate (`GitPythonVcs`) against the bare `git` CLI.

A generated repository (default 2,000 files over 200 commits on `main`, built in seconds with
`git fast-import`) is the project. One cycle is: create a worktree on a new branch from `main`, remove the
worktree, delete the branch. Ours goes through `GitPythonVcs.create_worktree` + `remove_worktree` (the
adapter taskgate's sessions use: off-loop thread, repository flock, idempotency checks, `--` separators).
The baseline runs the same three git commands as subprocesses (argv lists, same environment):
`git worktree add -b BRANCH PATH main`, `git worktree remove --force PATH`, `git branch -D BRANCH`.
The two alternate cycle by cycle (and swap who goes first every cycle) so both see the same machine noise.
Ratio = ours / baseline, goal ≤ 1.1×.

Afterwards an instrumented pass counts and times every git subprocess the adapter starts (by patching
GitPython's `Git.execute`) and reports what is left for Python, the thread hop and the lock.

Run:  .venv/bin/python benchmarks/worktree_cost.py [--iterations 30] [--files 2000] [--commits 200] [--repo DIR]
          [--tmp /dev/shm]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import math
import os
import pstats
import random
import statistics
import subprocess
import tempfile
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from git import Git

from taskgate.infrastructure.git import GitPythonVcs

GOAL_RATIO = 1.1
BASE = "main"
# the environment the adapter gives git (no prompts, no pager, C locale); the baseline uses the same
GIT_ENV = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_PAGER": "cat", "LC_ALL": "C"}
WORDS = (
    "alpha", "beta", "gamma", "delta", "session", "worktree", "branch", "merge", "rebase", "commit", "policy",
    "guard", "audit", "state", "plan", "task", "operator", "tracker", "review", "import", "export", "return",
    "yield", "async", "await", "lock", "queue", "event", "value", "result", "error",
)  # fmt: skip


# -- statistics -----------------------------------------------------------------------------------------------


def percentile(samples: list[int], pct: float) -> float:
    """Nearest-rank percentile of nanosecond samples, in milliseconds."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(pct / 100 * len(ordered)) - 1)] / 1e6


def median_ms(samples: list[int]) -> float:
    """Median of nanosecond samples, in milliseconds."""
    return statistics.median(samples) / 1e6


def verdict(ratio: float, goal: float) -> str:
    """'met' or 'MISSED' against a goal ratio."""
    return "met" if ratio <= goal else "MISSED"


# -- the generated repository -------------------------------------------------------------------------------


def git(cwd: Path, *args: str, stdin: bytes | None = None) -> str:
    """Run git (argv list) in `cwd`; returns stdout. Raises CalledProcessError with git's stderr."""
    done = subprocess.run(["git", *args], cwd=cwd, env=GIT_ENV, input=stdin, capture_output=True, check=False)
    if done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, ["git", *args], done.stdout, done.stderr)
    return done.stdout.decode()


def source_text(rng: random.Random, lines: int) -> bytes:
    """A source-like file body of `lines` lines."""
    out = []
    for number in range(lines):
        indent = "    " * rng.randint(0, 3)
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 10)))
        out.append(f"{indent}{words}  # {number}")
    return ("\n".join(out) + "\n").encode()


def fast_import_stream(files: int, commits: int, seed: int) -> Iterator[bytes]:
    """A `git fast-import` stream: `commits` commits on main, ending with `files` files in ~40 directories.

    The first commit adds half the files; each later commit adds its share of the rest and edits up to
    eight existing files, so history and blobs look like a small project's.
    """
    rng = random.Random(seed)
    paths = [f"pkg{n % 40:02d}/mod{n // 40:03d}/file_{n:05d}.py" for n in range(files)]
    first = files // 2
    added = 0
    stamp = 1_700_000_000
    for number in range(commits):
        target = first if number == 0 else first + (files - first) * number // max(1, commits - 1)
        if number == commits - 1:
            target = files
        changes = [(path, source_text(rng, rng.randint(20, 80))) for path in paths[added:target]]
        if added:
            changes += [(path, source_text(rng, rng.randint(20, 80))) for path in rng.sample(paths[:added], 8)]
        added = target
        message = f"commit {number}: {rng.choice(WORDS)} {rng.choice(WORDS)}\n".encode()
        stamp += rng.randint(60, 36_000)
        yield b"commit refs/heads/main\n"
        yield f"author Bench <bench@example.com> {stamp} +0000\n".encode()
        yield f"committer Bench <bench@example.com> {stamp} +0000\n".encode()
        yield b"data %d\n%s\n" % (len(message), message)
        for path, body in changes:
            yield b"M 100644 inline %s\ndata %d\n%s\n" % (path.encode(), len(body), body)
        yield b"\n"


def build_repo(root: Path, files: int, commits: int, seed: int = 7) -> float:
    """Create the repository at `root` (main checked out); returns the seconds it took."""
    begin = time.perf_counter()
    root.mkdir(parents=True, exist_ok=True)
    git(root, "init", "--quiet", "--initial-branch", BASE)
    git(root, "fast-import", "--quiet", stdin=b"".join(fast_import_stream(files, commits, seed)))
    git(root, "reset", "--quiet", "--hard", BASE)
    git(root, "gc", "--quiet")  # one pack, as a cloned repository has
    return time.perf_counter() - begin


def describe_repo(root: Path) -> tuple[int, int, int]:
    """(files in main, commits on main, bytes in the work tree's files) of the repository."""
    files = len(git(root, "ls-files", "-z").split("\0")) - 1
    commits = int(git(root, "rev-list", "--count", BASE))
    size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and ".git" not in p.parts)
    return files, commits, size


# -- one cycle each way ---------------------------------------------------------------------------------------


def baseline_create(repo: Path, path: Path, branch: str) -> None:
    git(repo, "worktree", "add", "--quiet", "-b", branch, str(path), BASE)


def baseline_remove(repo: Path, path: Path, branch: str) -> None:
    git(repo, "worktree", "remove", "--force", str(path))
    git(repo, "branch", "-D", branch)


def check_created(repo: Path, path: Path, branch: str, sample: str) -> None:
    """The worktree is there, checked out, on a new branch (cheap checks, outside the timed region)."""
    assert (path / sample).is_file(), f"{path} has no {sample}"
    assert (repo / ".git" / "refs" / "heads" / branch).is_file(), f"branch {branch} missing"


def check_removed(repo: Path, path: Path, branch: str) -> None:
    """Folder, worktree metadata and branch are gone."""
    assert not path.exists(), f"{path} still exists"
    assert not (repo / ".git" / "worktrees" / path.name).exists(), f"worktree metadata of {path.name} left"
    assert not (repo / ".git" / "refs" / "heads" / branch).exists(), f"branch {branch} left"


async def timed(action: Callable[[], Awaitable[Any]]) -> int:
    """Nanoseconds one awaited call takes."""
    begin = time.perf_counter_ns()
    await action()
    return time.perf_counter_ns() - begin


def timed_sync(action: Callable[[], Any]) -> int:
    """Nanoseconds one blocking call takes."""
    begin = time.perf_counter_ns()
    action()
    return time.perf_counter_ns() - begin


class Runner:
    """Runs numbered cycles of both kinds in one repository, worktrees in a sibling folder."""

    def __init__(self, repo: Path, worktrees: Path, sample: str) -> None:
        self.repo, self.worktrees, self.sample = repo, worktrees, sample
        self.vcs = GitPythonVcs()
        self.count = 0

    def _next(self, kind: str) -> tuple[Path, str]:
        self.count += 1
        return self.worktrees / f"{kind}-{self.count:04d}", f"bench/{kind}/{self.count:04d}"

    async def ours(self) -> tuple[int, int]:
        """(create ns, remove ns) through GitPythonVcs."""
        path, branch = self._next("ours")
        created = await timed(lambda: self.vcs.create_worktree(str(self.repo), str(path), branch, BASE))
        check_created(self.repo, path, branch, self.sample)
        removed = await timed(lambda: self.vcs.remove_worktree(str(self.repo), str(path), branch))
        check_removed(self.repo, path, branch)
        return created, removed

    def baseline(self) -> tuple[int, int]:
        """(create ns, remove ns) through the git CLI."""
        path, branch = self._next("git")
        created = timed_sync(lambda: baseline_create(self.repo, path, branch))
        check_created(self.repo, path, branch, self.sample)
        removed = timed_sync(lambda: baseline_remove(self.repo, path, branch))
        check_removed(self.repo, path, branch)
        return created, removed


async def measure(runner: Runner, iterations: int, warmup: int) -> dict[str, list[int]]:
    """Alternate ours and the baseline; every other cycle the baseline goes first."""
    samples: dict[str, list[int]] = defaultdict(list)
    for number in range(warmup + iterations):
        if number % 2:
            base = runner.baseline()
            ours = await runner.ours()
        else:
            ours = await runner.ours()
            base = runner.baseline()
        if number < warmup:
            continue
        for side, (created, removed) in (("ours", ours), ("git", base)):
            samples[f"{side} create"].append(created)
            samples[f"{side} remove"].append(removed)
            samples[f"{side} cycle"].append(created + removed)
    return samples


def report(samples: dict[str, list[int]]) -> float:
    """Print median/p95 per phase and the ratios; returns the cycle ratio of medians."""
    print(f"\n== one worktree cycle (n={len(samples['ours cycle'])} each, interleaved) ==")
    print(f"  {'':44} {'median':>10} {'p95':>10}")
    labels = {
        "create": "create worktree + branch",
        "remove": "remove worktree + delete branch",
        "cycle": "whole cycle",
    }
    ratio = 0.0
    for phase, label in labels.items():
        ours, base = samples[f"ours {phase}"], samples[f"git {phase}"]
        for side, values in (("taskgate", ours), ("git CLI", base)):
            print(f"  {side + ': ' + label:44} {median_ms(values):8.2f}ms {percentile(values, 95):8.2f}ms")
        med = median_ms(ours) / median_ms(base)
        p95 = percentile(ours, 95) / percentile(base, 95)
        print(f"  {'  ratio taskgate / git':44} {med:9.2f}× {p95:9.2f}×")
        print(f"  {'  taskgate − git':44} {median_ms(ours) - median_ms(base):8.2f}ms")
        if phase == "cycle":
            ratio = med
    print(f"  goal ≤ {GOAL_RATIO}× (whole cycle, medians): {verdict(ratio, GOAL_RATIO)}")
    return ratio


# -- where the time goes ----------------------------------------------------------------------------------------


def command_label(argv: list[str]) -> str:
    """'worktree add', 'branch -D', 'rev-parse', ...: the git subcommand of an argv list."""
    words = [a for a in argv[1:] if not a.startswith("-c") and "=" not in a]
    if words and words[0] in ("worktree", "branch", "config") and len(words) > 1:
        return " ".join(words[:2])
    return words[0] if words else "?"


@contextmanager
def git_calls() -> Iterator[list[tuple[str, int]]]:
    """Record (command, ns) of every `Git.execute` (GitPython's subprocess wrapper) while the block runs."""
    seen: list[tuple[str, int]] = []
    original = Git.execute

    def recording(self: Git, command: Any, *args: Any, **kwargs: Any) -> Any:
        begin = time.perf_counter_ns()
        try:
            return original(self, command, *args, **kwargs)
        finally:
            argv = list(command) if isinstance(command, list | tuple) else [str(command)]
            seen.append((command_label(argv), time.perf_counter_ns() - begin))

    Git.execute = recording  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        Git.execute = original  # type: ignore[method-assign]


@contextmanager
def profiled_worker_threads(profile: cProfile.Profile) -> Iterator[None]:
    """Profile what `asyncio.to_thread` runs (the adapter's blocking code) while the block runs."""
    original = asyncio.to_thread

    async def profiled(func: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        def run() -> Any:
            profile.enable()
            try:
                return func(*args, **kwargs)
            finally:
                profile.disable()

        return await original(run)

    asyncio.to_thread = profiled  # type: ignore[assignment]
    try:
        yield
    finally:
        asyncio.to_thread = original


PROFILED_FILES = (
    "taskgate/infrastructure/git.py",
    "/git/repo/",
    "/git/refs/",
    "/git/cmd.py",
    "/git/config.py",
    "subprocess.py",
)


async def python_profile(runner: Runner, cycles: int, top: int = 18) -> None:
    """cProfile of the adapter's worker-thread code over `cycles` cycles: cumulative ms per cycle."""
    profile = cProfile.Profile()
    with profiled_worker_threads(profile):
        for _ in range(cycles):
            path, branch = runner._next("cprof")
            await runner.vcs.create_worktree(str(runner.repo), str(path), branch, BASE)
            await runner.vcs.remove_worktree(str(runner.repo), str(path), branch)
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    rows = [
        (cumulative / cycles * 1000, calls / cycles, f"{Path(file).name}:{line} {name}")
        for (file, line, name), (_prim, calls, _total, cumulative, _callers) in stats.items()
        if any(part in file for part in PROFILED_FILES)
    ]
    print(f"  cProfile of the adapter's worker-thread code ({cycles} cycles, profiler overhead included):")
    print(f"    {'cumulative ms/cycle':>20} {'calls/cycle':>12}  function")
    for cumulative, calls, name in sorted(rows, reverse=True)[:top]:
        print(f"    {cumulative:20.2f} {calls:12.1f}  {name}")


async def breakdown(runner: Runner, cycles: int) -> None:
    """Per-call costs of the adapter's git subprocesses, the remainder, and the baseline's own calls."""
    phases: dict[str, list[int]] = defaultdict(list)
    per_command: dict[tuple[str, str], list[int]] = defaultdict(list)
    counts: dict[str, list[int]] = defaultdict(list)
    for _ in range(cycles):
        path, branch = runner._next("prof")
        for phase, call in (
            ("create", lambda p=path, b=branch: runner.vcs.create_worktree(str(runner.repo), str(p), b, BASE)),
            ("remove", lambda p=path, b=branch: runner.vcs.remove_worktree(str(runner.repo), str(p), b)),
        ):
            with git_calls() as seen:
                total = await timed(call)
            phases[phase].append(total)
            phases[f"{phase} in git"].append(sum(ns for _, ns in seen))
            counts[phase].append(len(seen))
            by_name: dict[str, int] = defaultdict(int)
            for name, ns in seen:
                by_name[name] += ns
                per_command[(phase, name)].append(ns)
    print(f"\n== where taskgate's time goes ({cycles} instrumented cycles; medians) ==")
    for phase in ("create", "remove"):
        total, in_git = median_ms(phases[phase]), median_ms(phases[f"{phase} in git"])
        print(
            f"  {phase}: {total:.2f} ms = {statistics.median(counts[phase]):.0f} git subprocesses "
            f"{in_git:.2f} ms + thread hop, lock, Python {total - in_git:.2f} ms"
        )
        for (which, name), values in sorted(per_command.items(), key=lambda kv: -statistics.median(kv[1])):
            if which == phase:
                calls = len(values) / cycles
                print(f"    git {name:26} {calls:4.1f}×/call  {median_ms(values):7.2f} ms each")
    spawn_gp = [timed_sync(lambda: Git(str(runner.repo)).execute(["git", "--version"])) for _ in range(30)]
    spawn_sp = [timed_sync(lambda: git(runner.repo, "--version")) for _ in range(30)]
    rev_gp = [timed_sync(lambda: Git(str(runner.repo)).execute(["git", "rev-parse", "HEAD"])) for _ in range(30)]
    rev_sp = [timed_sync(lambda: git(runner.repo, "rev-parse", "HEAD")) for _ in range(30)]
    print(
        f"  one `git --version` spawn: {median_ms(spawn_sp):.2f} ms via subprocess.run, "
        f"{median_ms(spawn_gp):.2f} ms via GitPython's Git.execute"
    )
    print(
        f"  one `git rev-parse HEAD` in this repo: {median_ms(rev_sp):.2f} ms via subprocess.run, "
        f"{median_ms(rev_gp):.2f} ms via Git.execute"
    )
    base: dict[str, list[int]] = defaultdict(list)
    for _ in range(cycles):
        path, branch = runner._next("prof-git")
        base["worktree add"].append(timed_sync(lambda p=path, b=branch: baseline_create(runner.repo, p, b)))
        base["worktree remove"].append(
            timed_sync(lambda p=path: git(runner.repo, "worktree", "remove", "--force", str(p)))
        )
        base["branch -D"].append(timed_sync(lambda b=branch: git(runner.repo, "branch", "-D", b)))
    print("  baseline, same pass: " + ", ".join(f"git {k} {median_ms(v):.2f} ms" for k, v in base.items()))
    await python_profile(runner, cycles)


# -- main ---------------------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    """Command-line flags."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=30, help="timed cycles of each kind (default 30)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed cycles of each kind first (default 3)")
    parser.add_argument("--files", type=int, default=2000, help="files in the generated repository (2000)")
    parser.add_argument("--commits", type=int, default=200, help="commits on its main branch (200)")
    parser.add_argument("--profile-cycles", type=int, default=10, help="instrumented cycles afterwards (10; 0 = off)")
    parser.add_argument("--repo", type=Path, help="build the repository here and keep it; reuse it if it exists")
    parser.add_argument(
        "--tmp",
        type=Path,
        help="parent of the scratch folder (worktrees, and the repository without --repo); "
        "e.g. /dev/shm to take the disk out of the measurement",
    )
    return parser.parse_args()


async def main() -> None:
    """Build (or reuse) the repository, then measure, report and break down."""
    args = parse_args()
    print(
        f"load average at start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores); "
        f"{git(Path.cwd(), '--version').strip()}"
    )
    with tempfile.TemporaryDirectory(prefix="taskgate-wt-bench-", dir=args.tmp) as tmp:
        repo = (args.repo or Path(tmp) / "repo").resolve()
        if (repo / ".git").is_dir():
            print(f"reusing {repo}")
        else:
            seconds = build_repo(repo, args.files, args.commits)
            print(f"built {repo} in {seconds:.1f} s")
        files, commits, size = describe_repo(repo)
        print(f"repository: {files} files, {commits} commits on {BASE}, {size / 1e6:.1f} MB checked out")
        worktrees = Path(tmp) / "worktrees"
        worktrees.mkdir()
        sample = git(repo, "ls-files", "-z").split("\0")[0]
        runner = Runner(repo, worktrees, sample)
        report(await measure(runner, args.iterations, args.warmup))
        if args.profile_cycles:
            await breakdown(runner, args.profile_cycles)
        leftovers = git(repo, "worktree", "list", "--porcelain").count("worktree ") - 1
        print(f"\nleft behind: {leftovers} worktrees, {len(git(repo, 'branch', '--list', 'bench/*').split())} branches")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
