"""Per-agent limits (docs/design/sandbox.md, section 4): a cgroup per agent caps its process count and its memory,
so a fork bomb or a 10 GiB allocation ends that agent, not the node, and says why it ended.

Standard library only: `agent_exec` imports this module and must start fast. The agent's wrapper puts itself into
the group (`apply`) before it starts bubblewrap, so the whole tree the agent makes is in it.

Where: `<root>/taskgate/<name>`, root being the cgroup v2 mount (when it offers `pids` and `memory`), else the v1
`pids` and `memory` hierarchies (one dir in each). Without a writable cgroup: `RLIMIT_AS` per process only.

Races: two agents never share a group, because names carry the agent id (the caller's job; names are validated
here). Concurrent creates of the shared `taskgate` parent tolerate EEXIST, and the parent is never removed, so a
create cannot lose its parent to another agent's `remove`. Re-creating an existing group (a restarted service)
is allowed and rewrites its limits.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import resource
import signal
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Literal

Kind = Literal["cgroup2", "cgroup1", "rlimit"]
PARENT = "taskgate"
_NAME = re.compile(r"[A-Za-z0-9_.-]+")
_PROBE_LIMITS_PIDS = 16
_PROBE_LIMITS_MEMORY = 64 * 2**20


@dataclass(frozen=True)
class Limits:
    """What one agent may use; None = no limit of that kind."""

    pids: int | None
    memory_bytes: int | None


@dataclass(frozen=True)
class Support:
    """Which mechanism works on this machine, and in plain words where or why not."""

    kind: Kind
    detail: str


@dataclass(frozen=True)
class _Layout:
    """Where groups can be made: v2, one dir; v1, the `pids` and `memory` hierarchies (the same dir if co-mounted)."""

    kind: Kind
    mounts: tuple[str, ...]

    def where(self) -> str:
        return " and ".join(self.mounts) if self.kind == "cgroup1" else self.mounts[0]


# -- reading the cgroup files ------------------------------------------------------------------------------------


def counter(text: str, key: str) -> int | None:
    """The number after `key` in a flat-keyed cgroup file (`pids.events`, `memory.events`, `memory.oom_control`)."""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key:
            return int(parts[1])
    return None


def pids_reason(events: str) -> str | None:
    """From `pids.events` (v1 and v2): the pids limit was hit when `max` counts refused forks."""
    refused = counter(events, "max") or 0
    return f"pids limit: fork refused {refused} times" if refused else None


def memory_reason(events: str) -> str | None:
    """From v2 `memory.events`: the memory limit ended a process when `oom_kill` is above 0."""
    return "memory limit: OOM-killed" if (counter(events, "oom_kill") or 0) > 0 else None


def memory_v1_reason(oom_control: str, failcnt: str) -> str | None:
    """From v1 `memory.oom_control` (`oom_kill N`, kernel 4.13 on); older kernels only count hits (`failcnt`)."""
    kills = counter(oom_control, "oom_kill")
    if kills is not None:
        return "memory limit: OOM-killed" if kills > 0 else None
    hits = int(failcnt.strip() or 0)
    return f"memory limit: reached {hits} times (this kernel does not count OOM kills)" if hits else None


def validate(name: str) -> str:
    """The group's name, or ValueError naming it: one path component of letters, digits, `_`, `.`, `-`."""
    if not _NAME.fullmatch(name) or name in (".", ".."):
        raise ValueError(f"invalid cgroup name {name!r}: use letters, digits, '_', '.', '-' only")
    return name


def _read(path: str) -> str:
    with open(path) as handle:
        return handle.read()


def _write(path: str, value: str) -> None:
    with open(path, "w") as handle:
        handle.write(value)


# -- finding the mounts --------------------------------------------------------------------------------------------


def parse_mountinfo(text: str) -> dict[str, str]:
    """Mount points of the cgroup hierarchies by what they hold: `cgroup2`, and each v1 controller (`pids`, …)."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        before, _, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        point = re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), fields[4])
        if tail[0] == "cgroup2":
            found.setdefault("cgroup2", point)
        elif tail[0] == "cgroup":
            for option in tail[2].split(","):
                found.setdefault(option, point)
    return found


def _has_controllers(v2_dir: str) -> bool:
    try:
        return {"pids", "memory"} <= set(_read(os.path.join(v2_dir, "cgroup.controllers")).split())
    except OSError:
        return False


def _layouts(root: str | None) -> list[_Layout]:
    """The usable layouts, best first. `root` stands for the mounts: a v2 dir (e.g. a delegated subtree) or a dir
    holding v1 `pids/` and `memory/` (a fake tree in tests); None reads /proc/self/mountinfo."""
    if root is not None:
        v2, v1 = root, (os.path.join(root, "pids"), os.path.join(root, "memory"))
        v1_found = all(os.path.isdir(path) for path in v1)
    else:
        mounts = parse_mountinfo(_read("/proc/self/mountinfo"))
        v2 = mounts.get("cgroup2", "")
        v1 = (mounts.get("pids", ""), mounts.get("memory", ""))
        v1_found = all(v1)
    layouts = [_Layout("cgroup2", (v2,))] if v2 and _has_controllers(v2) else []
    if v1_found:
        layouts.append(_Layout("cgroup1", tuple(dict.fromkeys(v1))))  # co-mounted: one dir
    return layouts


# -- the group -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Group:
    """One agent's group: its dirs (v2: one; v1: one per hierarchy; rlimit: none) and the limits it was made with."""

    kind: Kind
    name: str
    dirs: tuple[str, ...]
    limits: Limits

    def enter(self, pid: int) -> None:
        """Put process `pid` (and the children it starts afterwards) under the limits."""
        if self.kind == "rlimit":
            if self.limits.memory_bytes is not None:
                cap = self.limits.memory_bytes
                resource.prlimit(pid, resource.RLIMIT_AS, (cap, cap))
            return
        for path in self.dirs:
            _write(os.path.join(path, "cgroup.procs"), str(pid))

    def end_reason(self) -> str | None:
        """Why the agent ended, if a limit ended it: `pids limit: …`, `memory limit: …`; None when none was hit."""
        reasons = [reason for path in self.dirs for reason in _reasons(path)]
        return "; ".join(reasons) or None

    def pids(self) -> set[int]:
        """The processes in the group now."""
        found: set[int] = set()
        for path in self.dirs:
            with contextlib.suppress(FileNotFoundError):  # removed meanwhile
                found.update(int(pid) for pid in _read(os.path.join(path, "cgroup.procs")).split())
        return found

    def kill(self, timeout_s: float = 10.0) -> None:
        """End every process in the group: `cgroup.kill` (v2, kernel 5.14 on), else SIGKILL to each process,
        repeated until none is left (a forking process may add one between reading the list and the signal).
        The rlimit kind has no group: the supervisor's process-group stop ends the agent."""
        if self.kind == "cgroup2" and os.path.exists(os.path.join(self.dirs[0], "cgroup.kill")):
            _write(os.path.join(self.dirs[0], "cgroup.kill"), "1")
        deadline = time.monotonic() + timeout_s
        while left := self.pids():
            if time.monotonic() > deadline:
                raise TimeoutError(f"cgroup {self.name!r} still has processes {sorted(left)} after {timeout_s} s")
            self._kill_members(left)
            time.sleep(0.01)

    def _kill_members(self, listed: set[int]) -> None:
        """SIGKILL the listed processes without hitting a stranger that got a freed pid: a pidfd pins the process
        holding the pid when it is opened, and only the pids still in the group after that are signalled."""
        handles = {pid: fd for pid in listed if (fd := _pidfd(pid)) is not None}
        try:
            for pid in self.pids() & handles.keys():
                with contextlib.suppress(ProcessLookupError):  # exited meanwhile
                    signal.pidfd_send_signal(handles[pid], signal.SIGKILL)
        finally:
            for fd in handles.values():
                os.close(fd)

    def remove(self, timeout_s: float = 5.0) -> None:
        """Remove the group's dirs once it is empty (EBUSY is retried while the last processes exit); a group
        already gone is fine. The shared `taskgate` parent stays (see the module's note on races)."""
        for path in self.dirs:
            _rmdir(path, time.monotonic() + timeout_s)

    def to_json(self) -> str:
        """The group as JSON, for another process (agent_exec) to re-open it with `from_json`."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Group:
        """The group `to_json` described."""
        data = json.loads(text)
        return cls(data["kind"], validate(data["name"]), tuple(data["dirs"]), Limits(**data["limits"]))


def _reasons(path: str) -> list[str]:
    """The limits hit in one dir, from whichever of the controller files it holds."""

    def text(name: str) -> str | None:
        try:
            return _read(os.path.join(path, name))
        except FileNotFoundError:
            return None

    found = []
    if (events := text("pids.events")) is not None:
        found.append(pids_reason(events))
    if (events := text("memory.events")) is not None:
        found.append(memory_reason(events))
    if (oom := text("memory.oom_control")) is not None:
        found.append(memory_v1_reason(oom, text("memory.failcnt") or "0"))
    return [reason for reason in found if reason]


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:  # exited since the list was read
        return None


def _rmdir(path: str, deadline: float) -> None:
    while True:
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


# -- making groups -------------------------------------------------------------------------------------------------


def _limit(value: int | None, unlimited: str) -> str:
    return unlimited if value is None else str(value)


def _write_if_present(path: str, value: str) -> None:
    if os.path.exists(path):
        _write(path, value)


def _enable_controllers(v2_dir: str) -> None:
    """A v2 dir hands `pids` and `memory` to its children only when its `cgroup.subtree_control` says so."""
    control = os.path.join(v2_dir, "cgroup.subtree_control")
    enabled = set(_read(control).split()) if os.path.exists(control) else set()
    missing = {"pids", "memory"} - enabled
    if missing:
        _write(control, " ".join(f"+{controller}" for controller in sorted(missing)))


def _create_v2(mount: str, name: str, limits: Limits) -> Group:
    parent = os.path.join(mount, PARENT)
    _enable_controllers(mount)
    os.makedirs(parent, exist_ok=True)  # another agent may be making it at the same moment
    _enable_controllers(parent)
    path = os.path.join(parent, name)
    os.makedirs(path, exist_ok=True)  # idempotent: a restarted service re-creates its agent's group
    _write(os.path.join(path, "pids.max"), _limit(limits.pids, "max"))
    _write(os.path.join(path, "memory.max"), _limit(limits.memory_bytes, "max"))
    _write_if_present(os.path.join(path, "memory.swap.max"), "0")  # else the limit only moves pages to swap
    return Group("cgroup2", name, (path,), limits)


def _set_v1_memory(path: str, limit: str) -> None:
    """v1 requires `memory.limit_in_bytes <= memory.memsw.limit_in_bytes` (memory + swap) at every step, so the
    order depends on whether the limit grows or shrinks: try the limit first, and again after memsw if refused.
    memsw = the limit means no swap, where the kernel accounts swap at all (the file is absent otherwise)."""
    memsw = os.path.join(path, "memory.memsw.limit_in_bytes")
    try:
        _write(os.path.join(path, "memory.limit_in_bytes"), limit)
        written = True
    except OSError as exc:
        if exc.errno != errno.EINVAL or not os.path.exists(memsw):
            raise
        written = False
    _write_if_present(memsw, limit)
    if not written:
        _write(os.path.join(path, "memory.limit_in_bytes"), limit)


def _create_v1(mounts: tuple[str, ...], name: str, limits: Limits) -> Group:
    paths = tuple(os.path.join(mount, PARENT, name) for mount in mounts)
    for path in paths:
        os.makedirs(path, exist_ok=True)  # the parent may be made concurrently; the group may exist (a restart)
    pids_dir, memory_dir = paths[0], paths[-1]
    _write(os.path.join(pids_dir, "pids.max"), _limit(limits.pids, "max"))
    _set_v1_memory(memory_dir, _limit(limits.memory_bytes, "-1"))
    return Group("cgroup1", name, paths, limits)


def _create_in(layout: _Layout, name: str, limits: Limits) -> Group:
    if layout.kind == "cgroup2":
        return _create_v2(layout.mounts[0], name, limits)
    return _create_v1(layout.mounts, name, limits)


def create(name: str, limits: Limits, root: str | None = None) -> Group:
    """The group `<root>/taskgate/<name>` with `limits`, made (or re-made, with these limits) in the best layout that
    works here; without a writable cgroup, a group of kind `rlimit` (RLIMIT_AS per process, no pids limit).
    `root`: see `_layouts` (None = the system's cgroup mounts). ValueError for a bad name."""
    validate(name)
    for layout in _layouts(root):
        try:
            return _create_in(layout, name, limits)
        except OSError:
            continue  # the next layout, else the rlimit fallback; `probe` says why for doctor
    return Group("rlimit", name, (), limits)


def probe(root: str | None = None) -> Support:
    """Which mechanism works here, found by making and removing a throw-away group with pids and memory limits."""
    failures = []
    for layout in _layouts(root):
        name = f"probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            _create_in(layout, name, Limits(_PROBE_LIMITS_PIDS, _PROBE_LIMITS_MEMORY)).remove()
        except OSError as exc:
            failures.append(f"{layout.kind} at {layout.where()}: {exc.strerror or exc}")
            continue
        return Support(layout.kind, f"{layout.kind} at {layout.where()}: per-agent pids and memory limits work")
    why = "; ".join(failures) or "no cgroup mount offers both"
    return Support(
        "rlimit",
        f"no writable cgroup with the pids and memory controllers ({why}): fork bombs are not contained (the pid "
        "namespace still cleans up at the end) and memory is capped per process only (RLIMIT_AS); run the "
        "service as root or give it a delegated cgroup v2 subtree",
    )


def apply(name: str, limits: Limits) -> Group | None:
    """For agent_exec, before it starts bwrap: create the group and enter it with this process. Never raises:
    where limits cannot be set the agent still runs (doctor reports it); one line on stderr says why."""
    try:
        group = create(name, limits)
        group.enter(os.getpid())
    except Exception as exc:  # whatever went wrong, the agent must still run
        print(f"[taskgate sandbox] limits not applied: {exc}", file=sys.stderr, flush=True)
        return None
    if group.kind == "rlimit" and limits.pids is not None:
        print("[taskgate sandbox] pids limit not applied: no writable cgroup (memory: RLIMIT_AS)", file=sys.stderr)
    return group
