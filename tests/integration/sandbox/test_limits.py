"""Per-agent limits with real cgroups (root, as on the node and in CI; never skipped): a fork bomb and a 10 GiB
allocation end the agent and say why, a well-behaved agent ends normally, concurrent groups leave nothing behind.

Each child is started as agent_exec will start it: a small process enters the group, then execs the agent (here
also inside real bubblewrap), so the agent and everything it forks are in the group from the start."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from taskgate.infrastructure.sandbox import limits
from taskgate.infrastructure.sandbox.limits import Group, Limits

MiB = 2**20

# enter the group (as agent_exec does before it starts bwrap), then become the agent
ENTER_THEN_EXEC = """
import os, sys
from taskgate.infrastructure.sandbox.limits import Group
Group.from_json(sys.argv[1]).enter(os.getpid())
os.execvp(sys.argv[3], sys.argv[3:])
"""

# every process forks for ever; the first one reports once how far it got before the first refused fork
FORK_BOMB = """
import os, sys, time
top, forks, start = os.getpid(), 0, time.monotonic()
while True:
    try:
        child = os.fork()
    except BlockingIOError:
        if os.getpid() == top:
            print(f"{forks} {(time.monotonic() - start) * 1000:.0f}", flush=True)
            top = None
        time.sleep(0.05)
        continue
    if child and os.getpid() == top:
        forks += 1
"""

BWRAP = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-pid", "--die-with-parent"]


@pytest.fixture(autouse=True, scope="module")
def cgroups_here():
    assert os.geteuid() == 0, "these tests need root (as the node and CI run them): cgroups cannot be made otherwise"
    support = limits.probe()
    assert support.kind in ("cgroup1", "cgroup2"), f"no usable cgroup on this machine: {support.detail}"


@pytest.fixture
def groups():
    """Makes uniquely named groups, and ends and removes them after the test whatever happened."""
    made: list[Group] = []

    def make(memory_bytes: int | None = None, pids: int | None = None) -> Group:
        made.append(limits.create(f"test-{uuid.uuid4().hex[:12]}", Limits(pids=pids, memory_bytes=memory_bytes)))
        return made[-1]

    yield make
    for group in made:
        group.kill()
        group.remove()


def start(group: Group, argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", ENTER_THEN_EXEC, group.to_json(), "--", *argv], stdout=subprocess.PIPE, text=True
    )


def first_line(process: subprocess.Popen, timeout_s: float) -> str:
    ready, _, _ = select.select([process.stdout], [], [], timeout_s)
    assert ready, f"no output within {timeout_s} s"
    return process.stdout.readline()


def assert_fork_bomb_capped(group: Group, process: subprocess.Popen, where: str) -> None:
    forks, elapsed_ms = first_line(process, 20).split()
    in_group = len(group.pids())
    print(f"\n{where}: fork refused after {forks} forks of the first process, {elapsed_ms} ms; {in_group} in group")
    assert in_group <= 100
    assert (group.end_reason() or "").startswith("pids limit: fork refused ")
    group.kill()
    assert group.pids() == set()
    assert process.wait(10) == -9
    group.remove()
    assert not any(os.path.exists(path) for path in group.dirs)


def test_the_probe_finds_a_cgroup_here():
    support = limits.probe()
    assert support.kind in ("cgroup1", "cgroup2")
    assert "/sys/fs/cgroup" in support.detail


def test_a_fork_bomb_is_refused_and_the_group_says_so(groups):
    group = groups(pids=100)
    assert_fork_bomb_capped(group, start(group, [sys.executable, "-c", FORK_BOMB]), "plain")


def test_a_fork_bomb_inside_bubblewrap_is_capped_too(groups):
    group = groups(pids=100)
    bomb = start(group, [*BWRAP, "--", sys.executable, "-c", FORK_BOMB])
    assert_fork_bomb_capped(group, bomb, "in bwrap")


def test_a_10_gib_allocation_is_oom_killed_and_the_group_says_so(groups):
    group = groups(memory_bytes=256 * MiB)
    began = time.monotonic()
    process = start(group, [sys.executable, "-c", "data = b'x' * (10 * 2**30)"])
    assert process.wait(60) == -9
    print(f"\nOOM-killed {(time.monotonic() - began) * 1000:.0f} ms after start")
    assert group.end_reason() == "memory limit: OOM-killed"


def test_a_process_within_its_limits_ends_normally_with_no_reason(groups):
    group = groups(pids=100, memory_bytes=256 * MiB)
    process = start(group, [sys.executable, "-c", "data = b'x' * (16 * 2**20); print('done')"])
    assert process.communicate(timeout=30)[0] == "done\n"
    assert process.returncode == 0
    assert group.end_reason() is None


def test_twenty_groups_made_and_removed_at_once_leave_nothing_behind():
    prefix = f"test-{uuid.uuid4().hex[:8]}"

    def one_agent(index: int) -> int:
        group = limits.create(f"{prefix}-{index}", Limits(pids=50, memory_bytes=128 * MiB))
        code = start(group, [sys.executable, "-c", "pass"]).wait(60)
        group.kill()
        group.remove()
        return code

    with ThreadPoolExecutor(max_workers=20) as pool:
        assert list(pool.map(one_agent, range(20))) == [0] * 20
    group = limits.create(f"{prefix}-probe", Limits(pids=None, memory_bytes=None))
    parents = {os.path.dirname(path) for path in group.dirs}
    group.remove()
    assert [entry for parent in parents for entry in os.listdir(parent) if entry.startswith(prefix)] == []


def test_re_creating_a_group_keeps_it_and_sets_the_new_limits(groups):
    group = groups(pids=100, memory_bytes=256 * MiB)
    again = limits.create(group.name, Limits(pids=None, memory_bytes=512 * MiB))
    assert again.dirs == group.dirs
    process = start(again, [sys.executable, "-c", "data = b'x' * (384 * 2**20)"])
    assert process.wait(30) == 0


@pytest.mark.parametrize("name", ["a/b", "../up", "", "has space", ".."])
def test_a_bad_name_is_refused_and_named(name):
    with pytest.raises(ValueError, match="invalid cgroup name"):
        limits.create(name, Limits(pids=10, memory_bytes=None))
