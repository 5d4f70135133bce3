"""`SubprocessTestRunner`: runs a project's test command (require_tests) as an asyncio subprocess.

The command is an argv list (never a shell string) run in the worktree, in a new session and so a new process
group: a timeout kills the whole group (the test runner and everything it started), and so does the end of
every run, so children that linger (holding the output pipe) do not outlive it. stdout and stderr are read
together and only the last `tail_bytes` are kept, so a chatty test suite cannot fill memory.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from contextlib import suppress

from taskgate.application.sessions.ports import TestOutcome

_DRAIN_AFTER_EXIT_S = 1.0
_POLL_S = 0.02


class SubprocessTestRunner:
    """The `TestRunner` port over `asyncio.create_subprocess_exec`."""

    def __init__(self, tail_bytes: int = 16_000) -> None:
        self._tail_bytes = tail_bytes

    async def run(self, command: tuple[str, ...], cwd: str, *, timeout_s: float) -> TestOutcome:
        started = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(
                *command,
                cwd=cwd,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:  # missing program, no permission, missing cwd
            return TestOutcome(None, False, _ms(started), f"could not start {command[0]!r}: {exc.strerror or exc}")
        tail = bytearray()
        reader = asyncio.create_task(self._read(proc, tail))
        exited = asyncio.create_task(_exit_of(proc))
        timed_out = False
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.wait({reader, exited}, return_when=asyncio.FIRST_COMPLETED)
                if not reader.done():  # a child that inherited the pipe may keep it open: a moment, then stop
                    await asyncio.wait({reader}, timeout=_DRAIN_AFTER_EXIT_S)
                await exited
        except TimeoutError:
            timed_out = True
        finally:
            _kill_group(proc.pid)
            # With the group dead its pipe reaches EOF: reading it to the end lets asyncio close the transport
            # (a transport left open is only reclaimed by the garbage collector, possibly after its loop closed).
            await asyncio.wait({reader, exited}, timeout=_DRAIN_AFTER_EXIT_S)
            for task in (reader, exited):
                task.cancel()
                with suppress(asyncio.CancelledError):
                    await task
            with suppress(TimeoutError):  # SIGKILL is immediate; this only reaps
                await asyncio.wait_for(_exit_of(proc), 5)
        text = bytes(tail).decode("utf-8", errors="replace")
        if timed_out:
            text += f"\n[taskgate] killed after {timeout_s:g} s (timeout)"
        return TestOutcome(None if timed_out else proc.returncode, timed_out, _ms(started), text)

    async def _read(self, proc: asyncio.subprocess.Process, tail: bytearray) -> None:
        assert proc.stdout is not None
        while chunk := await proc.stdout.read(65_536):
            tail.extend(chunk)
            if len(tail) > self._tail_bytes:
                del tail[: len(tail) - self._tail_bytes]


async def _exit_of(proc: asyncio.subprocess.Process) -> None:
    """Until the process exited. `Process.wait()` also waits for its pipes to close, which a lingering child
    holding stdout can delay forever; the return code is set at exit, so poll that instead."""
    while proc.returncode is None:
        await asyncio.sleep(_POLL_S)


def _kill_group(pid: int) -> None:
    """SIGKILL the process group led by `pid` (a no-op when it is gone)."""
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)
