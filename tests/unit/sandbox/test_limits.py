"""The pure parts of per-agent limits: reading the cgroup files, finding the mounts, names, and what `create` writes,
on a fake cgroup tree in tmp_path (the `root` argument). The real cgroups: tests/integration/sandbox."""

from __future__ import annotations

import re
import resource
import subprocess

import pytest

from taskgate.infrastructure.sandbox import limits
from taskgate.infrastructure.sandbox.limits import Group, Limits

# this machine's: v1 controllers, and a v2 mount holding only hugetlb
MOUNTINFO = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
50 23 0:40 / /mnt/with\\040space rw shared:1 - cgroup cgroup rw,freezer
"""


def test_the_mounts_are_found_by_controller():
    mounts = limits.parse_mountinfo(MOUNTINFO)
    assert (mounts["pids"], mounts["memory"], mounts["cgroup2"]) == (
        "/sys/fs/cgroup/pids",
        "/sys/fs/cgroup/memory",
        "/sys/fs/cgroup/unified",
    )
    assert mounts["freezer"] == "/mnt/with space"
    assert "tmpfs" not in mounts.values()


def test_refused_forks_are_the_pids_reason():
    assert limits.pids_reason("max 7\n") == "pids limit: fork refused 7 times"
    assert limits.pids_reason("max 0\n") is None


def test_an_oom_kill_is_the_memory_reason_in_v2():
    events = "low 0\nhigh 0\nmax 31\noom 1\noom_kill 1\noom_group_kill 0\n"
    assert limits.memory_reason(events) == "memory limit: OOM-killed"
    assert limits.memory_reason("low 0\nhigh 0\nmax 3\noom 0\noom_kill 0\n") is None  # reclaimed, nothing killed


def test_an_oom_kill_is_the_memory_reason_in_v1():
    assert limits.memory_v1_reason("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n", "40\n") == (
        "memory limit: OOM-killed"
    )
    assert limits.memory_v1_reason("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n", "40\n") is None


def test_an_old_v1_kernel_without_oom_kill_reports_the_hits():
    assert limits.memory_v1_reason("oom_kill_disable 0\nunder_oom 0\n", "3\n") == (
        "memory limit: reached 3 times (this kernel does not count OOM kills)"
    )
    assert limits.memory_v1_reason("oom_kill_disable 0\nunder_oom 0\n", "0\n") is None


@pytest.mark.parametrize("name", ["a/b", "../up", "", "has space", ".", "..", "é"])
def test_a_bad_name_is_refused_and_named(name):
    with pytest.raises(ValueError, match="invalid cgroup name") as refused:
        limits.validate(name)
    assert repr(name) in str(refused.value)


def test_a_good_name_passes():
    assert limits.validate("s-12.agent_3") == "s-12.agent_3"


def v1_tree(tmp_path):
    (tmp_path / "pids").mkdir()
    (tmp_path / "memory").mkdir()
    return tmp_path


def test_a_v1_group_gets_a_dir_per_hierarchy_with_its_limits(tmp_path):
    group = limits.create("s1-a1", Limits(pids=100, memory_bytes=256 * 2**20), root=str(v1_tree(tmp_path)))
    assert group.kind == "cgroup1"
    assert group.dirs == (str(tmp_path / "pids/taskgate/s1-a1"), str(tmp_path / "memory/taskgate/s1-a1"))
    assert (tmp_path / "pids/taskgate/s1-a1/pids.max").read_text() == "100"
    assert (tmp_path / "memory/taskgate/s1-a1/memory.limit_in_bytes").read_text() == str(256 * 2**20)
    assert not (tmp_path / "memory/taskgate/s1-a1/memory.memsw.limit_in_bytes").exists()  # only where present


def test_re_creating_a_v1_group_rewrites_its_limits_and_swap_where_present(tmp_path):
    limits.create("s1-a1", Limits(pids=100, memory_bytes=2**20), root=str(v1_tree(tmp_path)))
    (tmp_path / "memory/taskgate/s1-a1/memory.memsw.limit_in_bytes").write_text("1048576")
    limits.create("s1-a1", Limits(pids=None, memory_bytes=None), root=str(tmp_path))
    assert (tmp_path / "pids/taskgate/s1-a1/pids.max").read_text() == "max"
    assert (tmp_path / "memory/taskgate/s1-a1/memory.limit_in_bytes").read_text() == "-1"
    assert (tmp_path / "memory/taskgate/s1-a1/memory.memsw.limit_in_bytes").read_text() == "-1"


def test_a_v2_group_is_one_dir_and_its_parents_hand_down_the_controllers(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("cpu io memory pids\n")
    (tmp_path / "taskgate/s1-a1").mkdir(parents=True)
    (tmp_path / "taskgate/s1-a1/memory.swap.max").write_text("max")
    group = limits.create("s1-a1", Limits(pids=50, memory_bytes=None), root=str(tmp_path))
    assert (group.kind, group.dirs) == ("cgroup2", (str(tmp_path / "taskgate/s1-a1"),))
    assert (tmp_path / "cgroup.subtree_control").read_text() == "+memory +pids"
    assert (tmp_path / "taskgate/cgroup.subtree_control").read_text() == "+memory +pids"
    assert (tmp_path / "taskgate/s1-a1/pids.max").read_text() == "50"
    assert (tmp_path / "taskgate/s1-a1/memory.max").read_text() == "max"
    assert (tmp_path / "taskgate/s1-a1/memory.swap.max").read_text() == "0"


def test_the_end_reason_reads_the_files_each_dir_holds(tmp_path):
    group = limits.create("s1-a1", Limits(pids=100, memory_bytes=2**20), root=str(v1_tree(tmp_path)))
    assert group.end_reason() is None
    (tmp_path / "pids/taskgate/s1-a1/pids.events").write_text("max 0\n")
    (tmp_path / "memory/taskgate/s1-a1/memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
    assert group.end_reason() is None
    (tmp_path / "pids/taskgate/s1-a1/pids.events").write_text("max 12\n")
    (tmp_path / "memory/taskgate/s1-a1/memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
    assert group.end_reason() == "pids limit: fork refused 12 times; memory limit: OOM-killed"


def test_a_group_survives_json_for_another_process(tmp_path):
    group = limits.create("s1-a1", Limits(pids=100, memory_bytes=None), root=str(v1_tree(tmp_path)))
    assert Group.from_json(group.to_json()) == group
    with pytest.raises(ValueError, match=re.escape("invalid cgroup name '../x'")):
        Group.from_json(group.to_json().replace('"s1-a1"', '"../x"'))


def test_without_a_cgroup_the_group_is_rlimit_only_and_the_probe_says_what_is_missing(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("hugetlb\n")  # like this machine's v2 mount
    group = limits.create("s1-a1", Limits(pids=100, memory_bytes=2**30), root=str(tmp_path))
    assert (group.kind, group.dirs, group.end_reason()) == ("rlimit", (), None)
    support = limits.probe(root=str(tmp_path))
    assert support.kind == "rlimit"
    assert "fork bombs are not contained" in support.detail
    assert "delegated cgroup v2 subtree" in support.detail


def test_the_rlimit_group_caps_the_address_space_of_the_process_it_enters():
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        Group("rlimit", "s1-a1", (), Limits(pids=100, memory_bytes=2**30)).enter(sleeper.pid)
        assert resource.prlimit(sleeper.pid, resource.RLIMIT_AS) == (2**30, 2**30)
    finally:
        sleeper.kill()
        sleeper.wait()


def test_apply_never_raises_and_says_why_in_one_line(capsys):
    assert limits.apply("bad/name", Limits(pids=10, memory_bytes=None)) is None
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("[taskgate sandbox] limits not applied: invalid cgroup name 'bad/name'")
