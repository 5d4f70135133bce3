"""Process groups on this host, read from /proc and signalled by any process (Linux).

An agent leads its own process group (its pid is the group's id). Whoever stops it (the process supervising it,
or any other taskgate process on the same node: `session fire ID cancel`, `session stop ID` from another terminal)
goes through `end_group`: SIGTERM to the group, SIGKILL after a grace period, until no process of the group is left.

Never a stranger's process: the agent's leader is identified by its pid *and* its start time (field 22 of
/proc/<pid>/stat, clock ticks since boot), recorded when it was launched. A leader that is there with another start
time is a new process that reused the pid: our group is gone (the kernel does not hand out a pid that is still a
live group's id), so nothing is signalled. A leader that is gone while members of its group live on (children the
agent left) still pins the group id, so a signal to the group reaches only them. What remains is the instant
between reading /proc and `killpg` in which the last member ends and a new process both gets that very pid and
makes itself a group leader: the kernel hands out pids in increasing order through `pid_max` (4,194,304 on 64-bit
Linux) before it wraps, so that needs millions of process starts in microseconds.
"""

from __future__ import annotations

import asyncio
import os
import signal
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

_POLL_S = 0.02
_PROC = Path("/proc")


@dataclass(frozen=True, slots=True)
class Ended:
    """How a stop went: `signal` is the one that ended the group ("SIGTERM", "SIGKILL"), None when it was gone
    already; `not_ours` when the pid now belongs to another process (nothing was signalled); `left` are pids of
    the group still there when the wait gave up (a process stuck in the kernel: uninterruptible sleep)."""

    signal: str | None
    not_ours: bool = False
    left: tuple[int, ...] = ()


def start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot, /proc/<pid>/stat field 22), None when there is none."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields is not None and len(fields) > 19 else None


def members(pgid: int) -> list[int]:
    """The live (not zombie) processes of the group `pgid` on this host."""
    found = []
    for entry in os.scandir(_PROC):
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        # fields[0] is the state (field 3), fields[2] the process group (field 5)
        if fields is not None and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def ours(pid: int, started: int | None) -> bool:
    """Whether signalling group `pid` reaches the agent launched as `pid` at `started`: its leader is that very
    process, or the leader is gone (its group, if any is left, is the agent's: see the module's docstring).
    With no recorded start time (an agent of an earlier release) only a leader that is there counts."""
    now = start_time(pid)
    if now is None:
        return started is not None
    return started is None or now == started


async def end_group(pid: int, started: int | None, grace_s: float, wait_s: float = 10.0) -> Ended:
    """SIGTERM to the process group `pid`, SIGKILL to what is left after `grace_s`, then wait (up to `wait_s`)
    until no member is left. Checked against `started` before each signal (see `ours`)."""
    if not ours(pid, started):
        return Ended(None, not_ours=start_time(pid) is not None)
    if not members(pid):
        return Ended(None)
    sent = _signal(pid, started, signal.SIGTERM)
    if sent is None:
        return Ended(None)
    if await wait_gone(pid, grace_s):
        return Ended("SIGTERM")
    if _signal(pid, started, signal.SIGKILL) is None:
        return Ended("SIGTERM")
    left = () if await wait_gone(pid, wait_s) else tuple(members(pid))
    return Ended("SIGKILL", left=left)


def kill_group(pid: int, sig: signal.Signals) -> None:
    """Signal the group `pid` (gone or not allowed: nothing)."""
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


async def wait_gone(pgid: int, within_s: float) -> bool:
    """Until no live process of the group is left (True), or `within_s` passed (False)."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + within_s
    while members(pgid):
        if loop.time() >= give_up:
            return False
        await asyncio.sleep(_POLL_S)
    return True


def _signal(pid: int, started: int | None, sig: signal.Signals) -> str | None:
    if not ours(pid, started):
        return None
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        return None
    return sig.name


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat after the command name (which may hold spaces and parentheses): field 3 onwards."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    _, _, rest = text.rpartition(") ")
    return rest.split() if rest else None
