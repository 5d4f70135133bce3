"""`SubprocessAgentRunner`: agent processes through `agent_exec`, each leading its own process group.

Why a process group: agents start test runners, compilers, language servers. A timeout or a cancel kills
the whole group (SIGTERM, then SIGKILL after a grace period), and so does the end of every run, so no child an
agent left behind survives it. Why the `agent_exec` wrapper: it writes the exit status to a file, so a
supervisor restarted after a crash can re-attach to a running agent by pid and still learn how it ended.

The environment is built, not inherited: PATH, HOME, LANG, LC_ALL, USER, TMPDIR, PYTHONPATH and the
variables the supervisor passes (TASKGATE_SESSION_ID, …, the agent type's own `env`). The service's own
secrets (database URL, tokens of other principals) never reach an agent.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from contextlib import suppress
from pathlib import Path

from taskgate.application.agents.ports import AgentExit, GroupEnded, Watching
from taskgate.domain.agents.setups import IGNORE_ALL
from taskgate.domain.errors import InvalidInput
from taskgate.domain.sandbox import SandboxPlan
from taskgate.infrastructure import process_groups
from taskgate.infrastructure.sandbox import confinement

TAIL_BYTES = 4_000
_POLL_S = 0.05
_CLEAR_WAIT_S = 5.0
_CHUNK = 1 << 20  # read at most this much of new output per poll
_PASSED_THROUGH = ("PATH", "HOME", "LANG", "LC_ALL", "USER", "TMPDIR", "PYTHONPATH")


def exit_file(output_path: str) -> str:
    return f"{output_path}.exit"


class SubprocessAgentRunner:
    """The AgentRunner port over asyncio subprocesses."""

    def __init__(self) -> None:
        self._children: dict[int, asyncio.subprocess.Process] = {}

    async def start(
        self,
        command: list[str],
        cwd: str,
        env: dict[str, str],
        output_path: str,
        inherit: Sequence[str] = (),
        sandbox: SandboxPlan | None = None,
    ) -> int:
        Path(output_path).parent.mkdir(parents=True, exist_ok=True)
        with suppress(FileNotFoundError):
            os.unlink(exit_file(output_path))
        passed = (*_PASSED_THROUGH, *inherit)  # credentials: only those the agent type names, never the rest
        environment = {k: os.environ[k] for k in passed if k in os.environ} | env
        wrapper = [sys.executable, "-m", "taskgate.infrastructure.agent_exec", exit_file(output_path)]
        if sandbox is not None:  # agent_exec (outside) serves its network gate and limits; bwrap confines the rest
            wrapper += ["--sandbox", confinement.write_spec(sandbox, os.path.basename(output_path))]
            command = confinement.wrap(sandbox, command)
            environment |= confinement.environment(sandbox)
        wrapper.append("--")
        with open(output_path, "ab") as output:
            try:
                proc = await asyncio.create_subprocess_exec(
                    *wrapper, *command, cwd=cwd, env=environment, stdin=asyncio.subprocess.DEVNULL,
                    stdout=output, stderr=asyncio.subprocess.STDOUT, start_new_session=True,
                )  # fmt: skip
            except OSError as exc:
                raise InvalidInput(f"agent could not be started in {cwd}: {exc.strerror or exc}") from None
        self._children[proc.pid] = proc
        return proc.pid

    async def wait(
        self,
        pid: int,
        *,
        output_path: str,
        watching: Watching,
        stop: asyncio.Event,
        beat: Callable[[], Awaitable[None]],
        beat_every_s: float,
        started: int | None = None,
    ) -> AgentExit:
        loop = asyncio.get_running_loop()
        deadline, next_beat = loop.time() + watching.timeout_s, loop.time() + beat_every_s
        output = _Follower(output_path, watching)
        reason = "exited"
        while self.alive(pid) and (started is None or process_groups.start_time(pid) in (started, None)):
            output.read(loop.time())
            if stop.is_set():
                reason = "cancelled"
            elif loop.time() >= deadline:
                reason = "timeout"
            elif output.size > watching.max_output_bytes:
                reason = "output_limit"
            elif watching.progress is not None and watching.progress.stalled(loop.time()):
                reason = "stalled"
                if watching.on_stall is not None:  # the event and the escalation come before the stop
                    await watching.on_stall(watching.progress.describe(loop.time()))
            if reason != "exited":
                break
            if loop.time() >= next_beat:
                await beat()
                next_beat = loop.time() + beat_every_s
            await asyncio.sleep(_POLL_S)
        ended = await self._end(pid, started, watching.grace_s) if reason != "exited" else None
        await self._clear_group(pid, started)  # children the agent left behind die with it, then it is reaped
        code = _read_exit(output_path) if reason == "exited" else None
        if reason == "exited" and code is None:
            reason = "lost"  # re-attached and gone without a recorded status (killed from outside)
        return AgentExit(code, reason, _tail(output_path), ended.signal if ended else None)

    def process_start(self, pid: int) -> int | None:
        return process_groups.start_time(pid)

    async def end(self, pid: int, started: int | None, grace_s: float) -> GroupEnded:
        ended = await process_groups.end_group(pid, started, grace_s)
        await self._reap(pid)
        return GroupEnded(ended.signal, ended.not_ours, ended.left)

    def ended(self, output_path: str) -> AgentExit | None:
        """How an agent that is gone ended, from the exit file its wrapper wrote (None: it recorded nothing)."""
        code = _read_exit(output_path)
        return None if code is None else AgentExit(code, "exited", _tail(output_path))

    def started(self, output_path: str | None) -> bool:
        """`start` opens the output file before it starts the process: no file, no process."""
        return output_path is None or Path(output_path).exists()

    def write_private(self, path: str, text: str) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        temporary = f"{path}.tmp"
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(temporary, path)

    def read_log(self, output_path: str, max_bytes: int) -> str:
        return _tail(output_path, max_bytes)

    def ignore_in_worktree(self, worktree: str, folder: str) -> None:
        # by descriptors with O_NOFOLLOW: a link planted at `folder` (an earlier run could commit one) is never
        # written through
        try:
            top = os.open(worktree, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            return  # gone (a cancel removed it): nothing to mark, and nothing is recreated
        try:
            with suppress(FileExistsError):
                os.mkdir(folder, 0o755, dir_fd=top)
            inner = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=top)
            try:
                out = os.open(".gitignore", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644, dir_fd=inner)
                with os.fdopen(out, "w", encoding="utf-8") as handle:
                    handle.write(IGNORE_ALL)
            finally:
                os.close(inner)
        except OSError:
            return  # not a folder (a file or a link there): left as it is; git shows it, approval's guard decides
        finally:
            os.close(top)

    def environment(self, names: Sequence[str]) -> dict[str, str]:
        return {name: os.environ[name] for name in names if os.environ.get(name)}

    def read_private(self, path: str) -> str | None:
        try:
            return Path(path).expanduser().read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None

    def has_credential(self, variables: Sequence[str], logins: Sequence[str]) -> bool:
        return any(os.environ.get(name) for name in variables) or any((Path.home() / f).exists() for f in logins)

    def locate(self, program: str) -> str | None:
        """The program's path as the agent's own PATH finds it (the service's PATH passes through)."""
        return shutil.which(program, path=os.environ.get("PATH"))

    def alive(self, pid: int) -> bool:
        child = self._children.get(pid)
        if child is not None:
            return child.returncode is None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return not _is_zombie(pid)

    async def _end(self, pid: int, started: int | None, grace_s: float) -> process_groups.Ended:
        """Stop the group; a child of this process stays a zombie until reaped, which pins its pid (and group id)
        for the signals (see process_groups)."""
        return await process_groups.end_group(pid, started, grace_s)

    async def _clear_group(self, pid: int, started: int | None) -> None:
        if process_groups.ours(pid, started) and process_groups.members(pid):
            process_groups.kill_group(pid, signal.SIGKILL)
            await process_groups.wait_gone(pid, _CLEAR_WAIT_S)
        await self._reap(pid)

    async def _reap(self, pid: int) -> None:
        child = self._children.pop(pid, None)
        if child is not None:
            with suppress(TimeoutError):
                await asyncio.wait_for(child.wait(), 5)


class _Follower:
    """Reads what the agent appends to its log as it comes, for the stall watch (and the output limit)."""

    def __init__(self, path: str, watching: Watching) -> None:
        self._path, self._progress = path, watching.progress
        self._heartbeat = watching.heartbeat_file
        self.size = _size(path)
        self._read_to = self.size  # a re-attached agent's earlier output is no news
        self._beat_at = _mtime(self._heartbeat)

    def read(self, now: float) -> None:
        self.size = _size(self._path)
        if self._progress is None:
            return
        if self.size > self._read_to:
            with open(self._path, "rb") as handle:
                handle.seek(self._read_to)
                chunk = handle.read(min(self.size - self._read_to, _CHUNK))
            self._read_to += len(chunk)
            self._progress.output(chunk.decode("utf-8", errors="replace"), now)
        beat_at = _mtime(self._heartbeat)
        if beat_at != self._beat_at:  # the agent touched its heartbeat file (scripted agents: _agentlib.heartbeat)
            self._beat_at = beat_at
            self._progress.progress(now)


def _mtime(path: str | None) -> float | None:
    if path is None:
        return None
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except (OSError, IndexError):
        return False


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _read_exit(output_path: str) -> int | None:
    try:
        return int(Path(exit_file(output_path)).read_text().strip())
    except (OSError, ValueError):
        return None


def _tail(path: str, max_bytes: int = TAIL_BYTES) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, _size(path) - max_bytes))
            return handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
