"""`LocalWorktreeSetup`: the WorktreeSetup port on this machine. Hooks run as `sh -c` in a process group of their
own, their output written straight to the session's `hooks.log` (a file, not a pipe, so a hook that leaves a process
behind never keeps taskgate waiting); `.worktreeinclude` files are found with git and copied with their modes.

Which files `.worktreeinclude` brings: `git ls-files --others --ignored --exclude-from=.worktreeinclude` lists the
untracked files its patterns match (gitignore syntax; git does not descend into the session worktrees, which are
checkouts of their own), and `git check-ignore` keeps those the repository's own ignore rules ignore. A tracked file
is never listed; a file whose real path leaves the repository (through a symbolic link) is skipped, and so is one
whose destination folder in the worktree leads out of it, or that exists there already.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import time
from contextlib import suppress
from datetime import UTC, datetime
from pathlib import Path

from taskgate.application.workspaces.ports import HookResult, IncludedFiles
from taskgate.domain.errors import StorageError, VcsError

INCLUDE_FILE = ".worktreeinclude"
KILL_GRACE_S = 3.0  # between SIGTERM and SIGKILL of a hook at its timeout
_LOG_FLAGS = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
_TAIL_BYTES = 64 * 1024
# git as taskgate runs it elsewhere (infrastructure/git.py): no prompts, no pager, none of the repository's hooks
# and no fsmonitor command
_GIT_ENV = {"GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C", "GIT_CONFIG_COUNT": "2",
            "GIT_CONFIG_KEY_0": "core.hooksPath", "GIT_CONFIG_VALUE_0": "/dev/null",
            "GIT_CONFIG_KEY_1": "core.fsmonitor", "GIT_CONFIG_VALUE_1": "false"}  # fmt: skip


class LocalWorktreeSetup:
    """Hooks as local processes, `.worktreeinclude` files copied on the local disk."""

    async def copy_included(self, repo_root: str, worktree: str) -> IncludedFiles:
        return await asyncio.to_thread(copy_included, repo_root, worktree)

    async def append_log(self, log_path: str, text: str) -> None:
        await asyncio.to_thread(_append, log_path, text.encode())

    async def run_hook(
        self, name: str, command: str, *, cwd: str, env: dict[str, str], timeout_s: float, log_path: str
    ) -> HookResult:
        fd = await asyncio.to_thread(_open_log, log_path)
        try:
            start = os.lseek(fd, 0, os.SEEK_END)
            header = f"=== {name} {datetime.now(UTC).isoformat(timespec='seconds')} in {cwd}\n$ {command}\n"
            os.write(fd, header.encode())
            began = time.monotonic()
            result = await _run(command, cwd, _environment(env), fd, timeout_s, began)
            how = "killed at its timeout" if result.timed_out else result.error or f"exit {result.exit_code}"
            os.write(fd, f"=== {name}: {how} after {result.duration_s:.1f} s\n".encode())
            last = _last_line(fd, start + len(header.encode()))
        finally:
            os.close(fd)
        return HookResult(result.exit_code, result.duration_s, last, result.timed_out, result.error)


async def _run(command: str, cwd: str, env: dict[str, str], fd: int, timeout_s: float, began: float) -> HookResult:
    try:
        process = await asyncio.create_subprocess_exec(
            "/bin/sh", "-c", command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=fd, stderr=fd,
            start_new_session=True,
        )  # fmt: skip
    except OSError as exc:
        return HookResult(None, time.monotonic() - began, "", error=f"{exc.strerror or exc}: {cwd}")
    try:
        code = await asyncio.wait_for(process.wait(), timeout_s)
    except TimeoutError:
        await _kill_group(process)
        return HookResult(None, time.monotonic() - began, "", timed_out=True)
    except asyncio.CancelledError:  # the caller gave up (a stop, a shutdown): the hook's processes go with it
        await asyncio.shield(_kill_group(process))
        raise
    return HookResult(code, time.monotonic() - began, "")


async def _kill_group(process: asyncio.subprocess.Process) -> None:
    """SIGTERM to the hook's whole process group, SIGKILL after the grace if it is still there."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)
        try:
            await asyncio.wait_for(process.wait(), KILL_GRACE_S)
        except TimeoutError:
            continue
        if sig == signal.SIGTERM:  # the shell is gone; what it left in the group goes too
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
        return


def _environment(env: dict[str, str]) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/"),
            **env}  # fmt: skip


def _open_log(log_path: str) -> int:
    """hooks.log opened for appending; a symbolic link planted at its name is refused, not followed.
    Raises: StorageError naming the log."""
    try:
        return os.open(log_path, _LOG_FLAGS, 0o644)
    except OSError as exc:
        raise StorageError(f"cannot write the hooks' log {log_path}: {exc.strerror or exc}") from None


def _append(log_path: str, data: bytes) -> None:
    fd = _open_log(log_path)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _last_line(fd: int, since: int) -> str:
    """The last non-blank line the hook wrote (after `since`), shortened."""
    end = os.lseek(fd, 0, os.SEEK_END)
    begin = max(since, end - _TAIL_BYTES)
    data = os.pread(fd, end - begin, begin).decode("utf-8", "replace")
    lines = [line.strip() for line in data.splitlines() if line.strip() and not line.startswith("=== ")]
    last = lines[-1] if lines else ""
    return last if len(last) <= 300 else last[:299] + "…"


# -- .worktreeinclude ---------------------------------------------------------------------------------------------


def copy_included(repo_root: str, worktree: str) -> IncludedFiles:
    """See WorktreeSetup.copy_included."""
    root = Path(repo_root).resolve()
    listing = root / INCLUDE_FILE
    if not listing.is_file() or listing.is_symlink():
        return IncludedFiles(listed=False)
    destination = Path(worktree).resolve()
    copied, skipped = [], []
    for relative in _ignored_matches(root, listing):
        try:
            why = _copy_one(root, destination, relative)
        except OSError as exc:
            why = exc.strerror or str(exc)
        (skipped.append(f"{relative}: {why}") if why else copied.append(relative))
    return IncludedFiles(True, copied, skipped)


def _ignored_matches(root: Path, listing: Path) -> list[str]:
    """Untracked files matched by `.worktreeinclude` that the repository's ignore rules ignore."""
    matched = _git(root, "ls-files", "-z", "--others", "--ignored", f"--exclude-from={listing}")
    candidates = [path for path in matched.split("\0") if path]
    if not candidates:
        return []
    ignored = _git(root, "check-ignore", "-z", "--stdin", stdin="\0".join(candidates) + "\0", ok=(0, 1))
    keep = set(filter(None, ignored.split("\0")))
    return sorted(path for path in candidates if path in keep)


def _copy_one(root: Path, destination: Path, relative: str) -> str:
    """Copy one file; "" when copied, else why not."""
    source = root / relative
    real = source.resolve()
    if real != root and root not in real.parents:
        return "it leads out of the repository (a symbolic link)"
    if not real.is_file():
        return "not a regular file"
    target = destination / relative
    if target.exists() or target.is_symlink():
        return "already in the worktree"
    parent = target.parent.resolve()  # before any folder is made: a link on the way must not lead mkdir out
    if parent != destination and destination not in parent.parents:
        return "its folder in the worktree leads out of it (a symbolic link)"
    parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(real, parent / target.name, follow_symlinks=False)  # contents, mode and times
    return ""


def _git(root: Path, *args: str, stdin: str | None = None, ok: tuple[int, ...] = (0,)) -> str:
    done = subprocess.run(["git", "-C", str(root), *args], input=stdin, capture_output=True, text=True,
                          env={**os.environ, **_GIT_ENV}, timeout=300, check=False)  # fmt: skip
    if done.returncode not in ok:
        raise VcsError(f"git {args[0]} failed listing the .worktreeinclude files: {done.stderr.strip()[-600:]}")
    return done.stdout
